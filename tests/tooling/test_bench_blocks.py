"""benchmarks/bench_blocks.py: its baseline, ssd_minimal_discrete as written out there, is the
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
