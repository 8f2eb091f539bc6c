"""What several test modules share: one torch thread, degenerate LTI SSMs, S4D/S5 layers at random parameters."""

import numpy as np
import pytest
import torch

from lib import DiagonalSSM, LinearSSM, SharedStateSSM

# The tensors are small, and on a shared two-core machine intra-op threads mostly wait for each
# other (the optimisers' CPU time grows up to 20x with two).
torch.set_num_threads(1)


def _ssm(A, N, d, p, seed):
    """A with B (N, d), C (p, N) iid N(0, 1) from default_rng(seed)."""
    rng = np.random.default_rng(seed)
    return LinearSSM(A, rng.standard_normal((N, d)), rng.standard_normal((p, N)))


DEGENERATE_SSMS = {  # (ssm, n) where the rank, the modes or the length degenerate
    "repeated eigenvalues": lambda: (_ssm(np.diag([0.5, 0.5, 0.5, -0.3]), 4, 2, 2, 1), 12),
    "jordan block": lambda: (_ssm(0.7 * np.eye(4) + np.eye(4, k=1), 4, 2, 3, 2), 12),
    "N > pd": lambda: (_ssm(LinearSSM.random(10, 1, 1, spectral_radius=0.9, seed=3).A.detach(), 10, 2, 2, 3), 16),
    "n < N": lambda: (LinearSSM.random(8, 3, 3, seed=4), 3),
    "nilpotent": lambda: (_ssm(np.eye(5, k=-1), 5, 2, 2, 5), 12),
    "B = 0 (k = 0)": lambda: (LinearSSM(0.5 * np.eye(3), np.zeros((3, 2)), np.ones((2, 3))), 6),
    "C = 0 (k = 0)": lambda: (LinearSSM(0.5 * np.eye(3), np.ones((3, 2)), np.zeros((2, 3))), 6),
    "p != d (1 x 4)": lambda: (LinearSSM.random(5, 4, 1, seed=6), 10),
    "p != d (3 x 1)": lambda: (LinearSSM.random(5, 1, 3, seed=7), 10),
    "N = 1": lambda: (LinearSSM.random(1, 2, 2, seed=8), 7),
    "n = 1": lambda: (LinearSSM.random(4, 2, 2, seed=9), 1),
    "damped rotation": lambda: (LinearSSM.damped_rotation(0.9, 0.7), 10),
}


@pytest.fixture(params=list(DEGENERATE_SSMS))
def degenerate_ssm(request) -> tuple[LinearSSM, int]:
    """(ssm, n) for each of DEGENERATE_SSMS (parametrize indirectly to pick some)."""
    return DEGENERATE_SSMS[request.param]()


def _random_diagonal(d, M, *, complex_modes=True, seed=0):
    # A DiagonalSSM at a random parameter (not an initialisation: random imaginary parts too).
    rng = np.random.default_rng(seed)
    C = rng.standard_normal((d, M, 2) if complex_modes else (d, M))
    return DiagonalSSM(rng.uniform(-3, 0, d), rng.standard_normal((d, M)), C, rng.standard_normal(d),
                       rng.uniform(-4, 4, (d, M)) if complex_modes else None)


def _random_shared(d, M, seed=0):
    rng = np.random.default_rng(seed)
    return SharedStateSSM(rng.uniform(-3, 0, M), rng.standard_normal(M), rng.uniform(-4, 4, M),
                          rng.standard_normal((M, d, 2)), rng.standard_normal((d, M, 2)), rng.standard_normal(d))


@pytest.fixture
def random_diagonal():
    """random_diagonal(d, M, complex_modes=True, seed=0): an S4D layer at a random parameter."""
    return _random_diagonal


@pytest.fixture
def random_shared():
    """random_shared(d, M, seed=0): an S5 layer at a random parameter."""
    return _random_shared
