"""benchmarks/bench_blocks.py: its baseline, ssd_minimal_discrete as written out there, equals mamba_ssm's
listing transcribed line by line at one group (the timed setting), bit for bit, and is the
SSD map (against lib's step-by-step loop, with groups and with padding-free lengths only, as
the reference requires). No timing is asserted."""

from __future__ import annotations

import pytest
import torch

from lib.scan import ssd_loop

from .conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_blocks")


@pytest.mark.parametrize("G, H, block_len", [(1, 3, 4), (2, 4, 3), (4, 4, 12)])
def test_ssd_minimal_discrete_is_the_ssd_map(bench, G, H, block_len):
    g = torch.Generator().manual_seed(G + H)
    b, L, P, N = 2, 12, 3, 5
    x = torch.randn(b, L, H, P, generator=g, dtype=torch.float64)
    delta = torch.nn.functional.softplus(torch.randn(b, L, H, generator=g, dtype=torch.float64))
    A = -torch.exp(torch.randn(H, generator=g, dtype=torch.float64))
    B, C = (torch.randn(b, L, G, N, generator=g, dtype=torch.float64) for _ in range(2))
    minimal = bench.ssd_minimal_discrete(x * delta[..., None], A * delta, B, C, block_len)
    assert torch.allclose(minimal, ssd_loop(delta, A, B, C, x), rtol=1e-12, atol=1e-12)


def _segsum_listing(x):
    # mamba_ssm's segsum (modules/ssd_minimal.py), einops' repeat written out
    T = x.size(-1)
    x = x[..., None].expand(*x.shape, T)
    x = x.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1), 0)
    x_segsum = torch.cumsum(x, dim=-2)
    return x_segsum.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=0), -torch.inf)


def _listing(X, A, B, C, block_len):
    # mamba_ssm's ssd_minimal_discrete with per-head B, C, line by line (einops' rearranges as reshapes)
    b, L = X.shape[:2]
    c = L // block_len
    X, A, B, C = (t.reshape(b, c, block_len, *t.shape[2:]) for t in (X, A, B, C))
    A = A.permute(0, 3, 1, 2)
    A_cumsum = torch.cumsum(A, dim=-1)
    L_ = torch.exp(_segsum_listing(A))
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L_, X)
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, X)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(_segsum_listing(torch.nn.functional.pad(A_cumsum[:, :, :, -1], (1, 0))))
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(A_cumsum))
    return (Y_diag + Y_off).reshape(b, c * block_len, *Y_diag.shape[3:])


@pytest.mark.parametrize("L, block_len", [(256, 64), (512, 256)])
def test_ssd_minimal_discrete_matches_a_literal_transcription_at_one_group(bench, L, block_len):
    # the timed setting (float32, one group, 8 heads of width 64, N = 128) against the listing itself
    g = torch.Generator().manual_seed(L)
    x = torch.randn(1, L, 8, 64, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(1, L, 8, generator=g) - 4)
    A = -torch.exp(torch.randn(8, generator=g))
    B, C = (torch.randn(1, L, 1, 128, generator=g) for _ in range(2))
    ours = bench.ssd_minimal_discrete(x * delta[..., None], A * delta, B, C, block_len)
    listing = _listing(x * delta[..., None], A * delta, B.expand(-1, -1, 8, -1), C.expand(-1, -1, 8, -1), block_len)
    assert torch.equal(ours, listing)   # bit for bit, as the performance page says
