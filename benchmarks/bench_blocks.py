"""Benchmark 5: the blocks as built against the implementations people run, on CPU.

    .venv/bin/python benchmarks/bench_blocks.py [--quick] [--pairs 5]

* `MambaBlock` forward (float32, `method="auto"`: the chunked selective scan from L = 64)
  against transformers' `MambaMixer` forward (its torch path, which CPUs take: `mamba_ssm`'s
  CUDA kernels are absent), the same weights (the mixer's state dict loaded strictly into the
  block), d_model = 256 (d_inner 512, N = 16), batch 1. L ∈ {256, 1024, 4096}. Target: ratio
  ≥ 1 at every L.
* The SSD route `lib.scan.ssd_chunked` (what `Mamba2Block` calls beyond L = 64) against
  `ssd_minimal_discrete`, the reference chunked SSD of mamba_ssm (`modules/ssd_minimal.py`,
  the Mamba-2 paper's Listing 1; a reference listing, not a kernel anyone runs in production),
  restructured below (no einops; C·B formed first, once per group; the heads grouped by group;
  at one group, the setting timed, outputs equal bit for bit to a literal transcription's, which
  is not timed; with G > 1 groups, head h reading group ⌊hG/H⌋ is this book's generalisation —
  the listing's einsums sum over the groups there); both with the same chunk
  size (64, the listing's; and 256, Mamba2Block's default, at L = 2048), float32, 8 heads of
  width 64, one group, N = 128. L ∈ {512, 2048, 8192}. Target: ratio ≥ 1 at L ≥ 2048.

Every row is checked first: outputs equal to max |Δ| / max |reference| ≤ 1e-4 (float32), or the
script exits 1. Method: benchmarks/harness.py (one thread, interleaved pairs after a warm-up,
median of the pairwise ratios). --quick: L ≤ 512, targets applied (a smoke run, not committed).
"""

from __future__ import annotations

import harness  # noqa: F401  (pins the thread pools before numpy / torch load)

import math  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402

from harness import Target, begin, finish, interleaved, max_rel_diff, row  # noqa: E402
from lib import MambaBlock  # noqa: E402
from lib.scan import ssd_chunked  # noqa: E402

CAPABILITY = "blocks"
TOLERANCE = 1e-4


def _segsum(x: torch.Tensor) -> torch.Tensor:
    # S[..., i, j] = Σ_{t=j+1}^{i} x_t (j <= i), −inf above: ssd_minimal's stable segment sum.
    T = x.shape[-1]
    x = x[..., None].expand(*x.shape, T)
    x = x.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), -1), 0)
    S = torch.cumsum(x, dim=-2)
    return S.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), -math.inf)


def ssd_minimal_discrete(X, A, B, C, block_len):
    """mamba_ssm's reference chunked SSD, restructured: C·B formed first, once per group, and the heads
    grouped by group (3-operand einsums for the listing's 4-operand one); the listing's outputs at one
    group; for G > 1, head h reads group h // (h/g) (the listing sums over groups instead).
    X (b, L, h, p) = Δ·x, A (b, L, h) = Δ·A, B, C (b, L, g, n), g | h (head h reads group h // (h/g));
    L a multiple of block_len. Returns Y (b, L, h, p)."""
    b, L, h, p = X.shape
    c, g, n = L // block_len, B.shape[2], B.shape[3]
    r = h // g
    X, A, B, C = (t.reshape(b, c, block_len, *t.shape[2:]) for t in (X, A, B, C))
    A = A.permute(0, 3, 1, 2)                                        # (b, h, c, l)
    A_cumsum = torch.cumsum(A, dim=-1)
    Xg = X.reshape(b, c, block_len, g, r, p)                         # heads grouped, no copy
    # 1. inside each chunk
    Lmat = torch.exp(_segsum(A)).reshape(b, g, r, c, block_len, block_len)
    CB = torch.einsum("bclgn,bcsgn->bgcls", C, B)
    Y_diag = torch.einsum("bgcls,bgrcls,bcsgrp->bclgrp", CB, Lmat, Xg)
    # 2. each chunk's final state
    decay_states = torch.exp(A_cumsum[..., -1:] - A_cumsum).reshape(b, g, r, c, block_len)
    states = torch.einsum("bclgn,bgrcl,bclgrp->bcgrpn", B, decay_states, Xg)
    # 3. the states entering each chunk, by the chunk-level segment sum
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(_segsum(torch.nn.functional.pad(A_cumsum[..., -1], (1, 0))))
    states = torch.einsum("bgrzc,bcgrpn->bzgrpn", decay_chunk.reshape(b, g, r, c + 1, c + 1), states)[:, :-1]
    # 4. their contribution inside each chunk
    out = torch.exp(A_cumsum).reshape(b, g, r, c, block_len)
    Y_off = torch.einsum("bclgn,bcgrpn,bgrcl->bclgrp", C, states, out)
    return (Y_diag + Y_off).reshape(b, L, h, p)


def mamba_rows(lengths, pairs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.MambaConfig(hidden_size=256, state_size=16, expand=2, conv_kernel=4,
                                      num_hidden_layers=1)
    mixer = transformers.models.mamba.modeling_mamba.MambaMixer(config, layer_idx=0).eval()
    block = MambaBlock(256, d_state=16, dt_rank=mixer.time_step_rank, dtype=torch.float32)
    block.load_state_dict(mixer.state_dict(), strict=True)
    rows = []
    for L in lengths:
        X = torch.randn(1, L, 256)
        with torch.no_grad():
            times, out = interleaved({"ours": lambda: block(X), "theirs": lambda: mixer(X)}, pairs)
        diff = max_rel_diff(out["ours"], out["theirs"])
        if not diff <= TOLERANCE:
            sys.exit(f"MambaBlock disagrees with MambaMixer at L = {L}: {diff:.2e}")
        rows.append(row(CAPABILITY, "forward", L, model="Mamba block, d_model 256, float32",
                        ours="MambaBlock (auto)", baseline="transformers MambaMixer (torch path)",
                        ours_times=times["ours"], baseline_times=times["theirs"], max_rel_diff=diff,
                        note=f"transformers {transformers.__version__}",
                        targets=[Target("ratio", ">=", 1.0, "≥ 1×")]))
    return rows


def ssd_rows(sizes, pairs, quick):
    """sizes: (L, chunk) pairs; 64 is the reference listing's chunk, 256 Mamba2Block's default."""
    g = torch.Generator().manual_seed(0)
    b, h, p, n = 1, 8, 64, 128
    rows = []
    for L, chunk in sizes:
        x = torch.randn(b, L, h, p, generator=g)
        delta = torch.nn.functional.softplus(torch.randn(b, L, h, generator=g) - 4)
        A = -torch.exp(torch.rand(h, generator=g))
        B, C = (torch.randn(b, L, 1, n, generator=g) for _ in range(2))
        with torch.no_grad():
            routes = {"ours": lambda: ssd_chunked(delta, A, B, C, x, chunk=chunk),
                      "minimal": lambda: ssd_minimal_discrete(x * delta[..., None], A * delta, B, C, chunk)}
            times, out = interleaved(routes, pairs)
        diff = max_rel_diff(out["ours"], out["minimal"])
        if not diff <= TOLERANCE:
            sys.exit(f"ssd_chunked disagrees with ssd_minimal_discrete at L = {L}: {diff:.2e}")
        targets = [Target("ratio", ">=", 1.0, "≥ 1×")] if L >= (256 if quick else 2048) else []
        rows.append(row(CAPABILITY, "ssd", L, model=f"SSD, 8 heads × 64, N 128, chunks of {chunk}, float32",
                        ours="lib.scan.ssd_chunked", baseline="ssd_minimal_discrete (mamba_ssm)",
                        ours_times=times["ours"], baseline_times=times["minimal"], max_rel_diff=diff,
                        targets=targets))
    return rows


def main() -> int:
    args = harness.parser(__doc__.splitlines()[0]).parse_args()
    begin(CAPABILITY, "Benchmark 5: the blocks vs transformers and mamba_ssm's reference SSD", args)
    rows = mamba_rows((64, 256) if args.quick else (256, 1024, 4096), args.pairs)
    sizes = [(128, 64), (256, 64)] if args.quick else [(512, 64), (2048, 64), (8192, 64), (2048, 256)]
    rows += ssd_rows(sizes, args.pairs, args.quick)
    return finish(rows, CAPABILITY, args)


if __name__ == "__main__":
    sys.exit(main())
