"""Benchmark 5: the blocks as built (lib.blocks) and the SSD route against transformers' torch paths.

    .venv/bin/python benchmarks/bench_blocks.py [--quick] [--pairs 5]

Two comparisons, float32 on CPU, one thread (benchmarks/harness.py):

* `MambaBlock` forward (`method="auto"`: lib.scan.selective_scan from n = 64) against
  transformers' `MambaMixer` forward (its torch path: no mamba_ssm kernels installed; a
  Python loop over the sequence), same weights (`load_state_dict(strict=True)`), batch 1.
  Target: ratio >= 1.
* The SSD route `lib.scan.ssd_chunked` against transformers' `mamba2_chunk_scan` (the torch
  path of `Mamba2Mixer`: the chunked algorithm of mamba_ssm's `ssd_minimal_discrete`, Listing 1
  of Dao & Gu 2024, with B and C per group), both given the same Δ, A, B, C, x, chunks of 64.
  Baseline imported from the installed transformers, not vendored. Target: ratio >= 1 at
  L >= 2048.

Every pair must agree: max |ours − baseline| / max |baseline| <= 1e-4 (float32 on both sides).
"""

from __future__ import annotations

import harness  # noqa: F401  (pins the thread pools before numpy / torch load)

import sys  # noqa: E402

import torch  # noqa: E402

from harness import Target, begin, finish, interleaved, max_rel_diff, row  # noqa: E402
from lib import MambaBlock  # noqa: E402
from lib.scan import ssd_chunked  # noqa: E402

CAPABILITY = "blocks"
TOLERANCE = 1e-4
MAMBA = dict(d_model=128, d_state=16, d_conv=4, expand=2)
MAMBA_SIZES, MAMBA_QUICK = (512, 2048), (128,)
SSD = dict(heads=8, headdim=64, d_state=64, groups=1, chunk=64)
SSD_SIZES, SSD_QUICK = (1024, 2048, 4096), (256,)


def mamba_pair():
    from transformers import MambaConfig
    from transformers.models.mamba.modeling_mamba import MambaMixer

    block = MambaBlock(**MAMBA, dtype=torch.float32).requires_grad_(False)
    config = MambaConfig(hidden_size=block.d_model, state_size=block.d_state, conv_kernel=block.d_conv,
                         intermediate_size=block.d_inner, time_step_rank=block.dt_rank, use_bias=False,
                         use_conv_bias=True)
    mixer = MambaMixer(config, layer_idx=0).eval().requires_grad_(False)
    mixer.load_state_dict(block.state_dict(), strict=True)
    return block, mixer


def ssd_inputs(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    H, P, N, G = SSD["heads"], SSD["headdim"], SSD["d_state"], SSD["groups"]
    x = torch.randn(1, n, H, P, generator=gen)
    delta = torch.nn.functional.softplus(torch.randn(1, n, H, generator=gen) - 4)
    A = -torch.exp(torch.rand(H, generator=gen))
    B, C = (torch.randn(1, n, G, N, generator=gen) for _ in range(2))
    return delta, A, B, C, x


def main() -> int:
    args = harness.parser(__doc__.splitlines()[0]).parse_args()
    begin(CAPABILITY, "Benchmark 5: the blocks as built vs transformers' torch paths", args)
    from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan

    rows, failed = [], False
    block, mixer = mamba_pair()
    for n in (MAMBA_QUICK if args.quick else MAMBA_SIZES):
        X = torch.randn(1, n, block.d, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            times, out = interleaved({"ours": lambda: block(X), "baseline": lambda: mixer(X)}, args.pairs)
        diff = max_rel_diff(out["ours"], out["baseline"])
        note = "" if diff <= TOLERANCE else f"VALUES DIFFER: {diff:.1e} > {TOLERANCE:.0e}"
        failed |= bool(note)
        rows.append(row(CAPABILITY, "MambaBlock forward", n,
                        model="d_model=128 d_state=16 d_conv=4 expand=2, float32, batch 1",
                        ours="lib.MambaBlock (auto: selective_scan)", baseline="transformers MambaMixer (torch path)",
                        ours_times=times["ours"], baseline_times=times["baseline"], max_rel_diff=diff, note=note,
                        targets=[Target("ratio", ">=", 1, "≥ 1×"), Target("max_rel_diff", "<=", TOLERANCE, "≤ 1e-4")]))
    Q = SSD["chunk"]
    for n in (SSD_QUICK if args.quick else SSD_SIZES):
        delta, A, B, C, x = ssd_inputs(n)
        ours = lambda: ssd_chunked(delta, A, B, C, x, chunk=Q)
        baseline = lambda: mamba2_chunk_scan(x, delta, A, B, C, chunk_size=Q)
        with torch.no_grad():
            times, out = interleaved({"ours": ours, "baseline": baseline}, args.pairs)
        diff = max_rel_diff(out["ours"], out["baseline"])
        note = "" if diff <= TOLERANCE else f"VALUES DIFFER: {diff:.1e} > {TOLERANCE:.0e}"
        failed |= bool(note)
        targets = [Target("max_rel_diff", "<=", TOLERANCE, "≤ 1e-4")]
        if n >= 2048:
            targets.insert(0, Target("ratio", ">=", 1, "≥ 1×"))
        rows.append(row(CAPABILITY, "SSD chunked scan", n, model="H=8 P=64 N=64 G=1, chunks of 64, float32",
                        ours="lib.scan.ssd_chunked", baseline="transformers mamba2_chunk_scan (ssd_minimal_discrete)",
                        ours_times=times["ours"], baseline_times=times["baseline"], max_rel_diff=diff, note=note,
                        targets=targets))
    status = finish(rows, CAPABILITY, args)
    return 1 if failed else status


if __name__ == "__main__":
    sys.exit(main())
