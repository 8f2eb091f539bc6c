"""Each fast route that `make bench` times is right, on small sizes and edge cases.

Correctness only, never speed (speed is benchmarks/, as same-process ratios). Every route is
compared with an independent computation in plain numpy (tests/reference_operators.py, which
imports nothing from lib), never with another route of lib:

- `min_heads` / `optimal_head_errors` (from the lags) vs the dense route of the benchmark,
  built in numpy: the operator C A^{i−j} B (n, n, p, d) from A, B, C, its blocks with j ≤ i
  stacked, their SVD;
- `jacobian_norms` (p reverse passes) vs `torch.autograd.functional.jacobian` of the whole map
  (and, for the LTI SSM, vs the numpy lags ‖C A^ℓ B‖);
- forward routes (LinearSSM "recurrence", "scan", "auto"; SelectiveSSM and SSD
  "recurrence", "scan", "auto") vs the numpy reference: a convolution with numpy lags for the
  LTI SSM, the chapter's recurrences transcribed with loops for the selective SSM and SSD;
  their gradients vs central differences of the numpy reference.

Edge cases: n = 1, N = 1, p ≠ d, batches, lengths on the chunk and route boundaries,
numpy/torch in and out.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reference_operators as ref
from lib import SSD, LinearSSM, SelectiveSSM, SoftmaxAttention
from lib.gradients import jacobian_norms
from lib.heads import min_heads, optimal_head_errors

# -- the dense route of the head counts -----------------------------------------------


def dense_singular_values(ssm: LinearSSM, n: int) -> np.ndarray:
    """Singular values of the stacked operator blocks 𝒲_ij = C A^{i−j} B, j ≤ i (numpy, from A, B, C)."""
    W = ref.lti_operator(ssm.A, ssm.B, ssm.C, n)
    rows, cols = np.tril_indices(n)
    return np.linalg.svd(W[rows, cols].reshape(len(rows), ssm.p * ssm.d), compute_uv=False)


def dense_rank(ssm: LinearSSM, n: int, rtol: float = 1e-10) -> int:
    sigma = dense_singular_values(ssm, n)
    return int((sigma > rtol * sigma[0]).sum()) if sigma[0] > 0 else 0


# (N, d, p, n): n = 1, N = 1, p ≠ d both ways, n < pd, n > pd, N > pd.
HEAD_CASES = [(1, 1, 1, 1), (1, 2, 3, 1), (1, 3, 2, 4), (2, 1, 1, 5), (3, 2, 3, 2), (4, 3, 2, 9),
              (7, 2, 2, 12), (5, 1, 4, 6)]


@pytest.mark.parametrize("N,d,p,n", HEAD_CASES)
def test_min_heads_equals_rank_of_the_dense_operator(N, d, p, n):
    for seed, radius in ((0, 0.9), (1, 1.0), (2, 0.3)):
        ssm = LinearSSM.random(N, d, p, spectral_radius=radius, seed=seed)
        assert min_heads(ssm, n) == dense_rank(ssm, n)


@pytest.mark.parametrize("N,d,p,n", HEAD_CASES)
def test_optimal_head_errors_equal_tail_energies_of_the_dense_operator(N, d, p, n):
    ssm = LinearSSM.random(N, d, p, spectral_radius=0.9, seed=N + n)
    H_max = p * d + 2  # beyond every possible rank: the tail is padded with zeros
    squares = dense_singular_values(ssm, n) ** 2
    dense = np.array([squares[H:].sum() for H in range(H_max + 1)])
    ours = optimal_head_errors(ssm, n, H_max)
    assert ours.shape == (H_max + 1,)
    np.testing.assert_allclose(ours, dense, rtol=1e-10, atol=1e-12 * dense[0])


def test_head_counts_of_a_zero_ssm_agree_with_the_dense_route():
    ssm = LinearSSM(np.eye(2), np.ones((2, 3)), np.zeros((2, 2)))
    assert min_heads(ssm, 4) == 0
    np.testing.assert_array_equal(optimal_head_errors(ssm, 4, 3), np.zeros(4))
    assert np.all(dense_singular_values(ssm, 4) == 0)


def test_head_counts_reach_the_dense_route_on_a_rank_deficient_ssm():
    # A nilpotent A: only L_0 and L_1 are non-zero, so k = 2 for every n >= 2 and 1 for n = 1.
    A = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    rng = np.random.default_rng(0)
    ssm = LinearSSM(A, rng.standard_normal((3, 3)), rng.standard_normal((2, 3)))
    for n in (1, 2, 6):
        assert min_heads(ssm, n) == dense_rank(ssm, n) == min(n, 2)


# -- jacobian_norms vs the full autograd Jacobian ---------------------------------------


def autograd_norms(model, X: np.ndarray, i: int) -> np.ndarray:
    """‖∂y_i/∂x_j‖_F, j ≤ i, from torch.autograd.functional.jacobian (vectorised), as benchmarked."""
    J = torch.autograd.functional.jacobian(lambda Z: model(Z), torch.tensor(X), vectorize=True)
    return np.linalg.norm(J[i, :, : i + 1, :].permute(1, 0, 2).numpy(), axis=(1, 2))


JACOBIAN_MODELS = {
    "LinearSSM N=1 d=1 p=1": lambda: LinearSSM.random(1, 1, 1, seed=0),
    "LinearSSM N=3 d=2 p=3": lambda: LinearSSM.random(3, 2, 3, seed=1),
    "SelectiveSSM N=1 d=1": lambda: SelectiveSSM.random(1, 1, step_range=(0.1, 1.0), seed=2),
    "SelectiveSSM N=3 d=2": lambda: SelectiveSSM.random(2, 3, step_range=(0.1, 1.0), seed=3),
    "SSD H=2 d=2 p=3": lambda: SSD.random(2, 3, N=2, heads=2, step_range=(0.1, 1.0), seed=4),
    "SoftmaxAttention d=3 p=2": lambda: SoftmaxAttention.random(3, 2, heads=1, seed=5),
}


@pytest.mark.parametrize("name", JACOBIAN_MODELS)
@pytest.mark.parametrize("n", [1, 2, 9])
def test_jacobian_norms_equal_the_autograd_jacobian_including_n_1(name, n):
    model = JACOBIAN_MODELS[name]()
    X = np.random.default_rng(n).standard_normal((n, model.d))
    for i in sorted({0, n // 2, n - 1}):
        ours = jacobian_norms(model, X, i)
        assert ours.shape == (i + 1,)
        np.testing.assert_allclose(ours, autograd_norms(model, X, i), rtol=1e-10, atol=1e-14)


def test_jacobian_norms_on_both_forward_routes_of_an_lti_ssm():
    # n = 300 > 256: the scan route under "auto"; both routes give C A^{i-j} B.
    model = LinearSSM.random(3, 2, 2, spectral_radius=0.9, seed=0)
    X = np.random.default_rng(0).standard_normal((300, 2))
    lags = np.linalg.norm(ref.lti_lags(model.A, model.B, model.C, 300), axis=(1, 2))
    np.testing.assert_allclose(jacobian_norms(model, X, 299)[::-1], lags, rtol=1e-10)
    np.testing.assert_allclose(jacobian_norms(model, X[:200], 199)[::-1], lags[:200], rtol=1e-10)


# -- forward routes vs the sequential loop ---------------------------------------------

# (N, d, p, n, b): n = 1, N = 1, p ≠ d both ways, batched; n on the scan's chunk edges
# (T = 64), on the "auto" switch (256/257) and on FFT sizes (powers of two).
LTI_CASES = [(1, 1, 1, 1, 1), (1, 3, 2, 1, 4), (2, 1, 3, 2, 1), (1, 2, 1, 63, 2), (3, 2, 3, 64, 1),
             (2, 3, 1, 65, 3), (4, 2, 2, 129, 2), (2, 1, 2, 256, 1), (2, 2, 1, 257, 2),
             (5, 3, 2, 513, 1)]


@pytest.mark.parametrize("N,d,p,n,b", LTI_CASES)
def test_lti_routes_equal_the_numpy_convolution_by_lags(N, d, p, n, b):
    model = LinearSSM.random(N, d, p, spectral_radius=0.95, seed=n)
    X = np.random.default_rng(N * n).standard_normal((b, n, d))
    expected = np.stack([ref.lti_convolution(model.A, model.B, model.C, x) for x in X])
    for method in ("recurrence", "scan", "auto"):
        Y = model(X, method=method)
        assert isinstance(Y, np.ndarray) and Y.shape == (b, n, p)
        np.testing.assert_allclose(Y, expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max())
        one = model(torch.tensor(X[-1]), method=method)  # torch in, torch out, unbatched
        assert isinstance(one, torch.Tensor) and one.shape == (n, p)
        np.testing.assert_allclose(one.numpy(), expected[-1], rtol=1e-10, atol=1e-12 * np.abs(expected).max())


def test_lti_routes_keep_tiny_outputs_to_relative_accuracy():
    # Why LinearSSM has no FFT route: an FFT's rounding error is absolute (~1e-16 of the largest
    # output), so an impulse response decaying below that is lost; the loop and the scan keep
    # every entry to relative accuracy.
    model = LinearSSM.random(4, 2, 2, spectral_radius=0.5, seed=0)
    for n in (100, 300):  # the loop, then the scan under "auto"
        X = np.zeros((n, 2))
        X[0, 0] = 1.0  # y_i = L_i e_0
        L = ref.lti_lags(model.A, model.B, model.C, n)[:, :, 0]
        assert np.abs(L[-1]).max() < 1e-25
        for method in ("recurrence", "scan", "auto"):
            np.testing.assert_allclose(model(X, method=method), L, rtol=1e-10, atol=0)


@pytest.mark.parametrize("N,d,n,b", [(1, 1, 1, 1), (1, 2, 1, 3), (2, 1, 2, 2), (3, 2, 3, 1), (1, 3, 4, 2),
                                     (4, 2, 16, 1), (2, 2, 17, 2), (3, 1, 63, 1), (2, 3, 65, 2),
                                     (1, 1, 400, 1)])
def test_selective_routes_equal_the_numpy_recurrence(N, d, n, b):
    # n = T² and T² + 1 cross the two-level scan's chunking (T = ceil(√n)).
    model = SelectiveSSM.random(d, N, step_range=(0.05, 2.0), seed=n)
    X = np.random.default_rng(n).standard_normal((b, n, d))
    expected = ref.forward(model, X)
    for method in ("recurrence", "scan", "auto"):
        Y = model(X, method=method)
        assert Y.shape == (b, n, d)
        np.testing.assert_allclose(Y, expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max())


@pytest.mark.parametrize("N,H,dh,p,n,b", [(1, 1, 1, 1, 1, 1), (1, 2, 1, 3, 1, 2), (2, 1, 2, 1, 5, 3),
                                          (3, 2, 2, 5, 16, 1), (1, 3, 1, 2, 17, 2), (2, 1, 1, 2, 65, 1),
                                          (2, 2, 1, 1, 300, 2)])
def test_ssd_routes_equal_the_numpy_recurrence(N, H, dh, p, n, b):
    d = H * dh
    model = SSD.random(d, p, N=N, heads=H, step_range=(0.05, 2.0), seed=n)
    X = np.random.default_rng(n).standard_normal((b, n, d))
    expected = ref.forward(model, X)
    for method in ("recurrence", "scan", "auto"):
        Y = model(X, method=method)
        assert Y.shape == (b, n, p)
        np.testing.assert_allclose(Y, expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max())


@pytest.mark.parametrize("make", [lambda: SelectiveSSM.random(2, 3, step_range=(0.1, 1.0), seed=0),
                                  lambda: SSD.random(4, 3, N=2, heads=2, step_range=(0.1, 1.0), seed=0)],
                         ids=["SelectiveSSM", "SSD"])
@pytest.mark.parametrize("method", ["recurrence", "scan", "auto"])
def test_selective_routes_have_the_gradients_of_the_numpy_reference_batched(make, method):
    model = make()
    X = np.random.default_rng(0).standard_normal((2, 13, model.d))
    Xt = torch.tensor(X, requires_grad=True)
    (g,) = torch.autograd.grad(model(Xt, method=method)[:, 8].sum(), Xt)
    expected = ref.central_difference_gradient(lambda Z: ref.forward(model, Z)[:, 8].sum(), X)
    np.testing.assert_allclose(g.numpy(), expected, rtol=1e-6, atol=1e-9)
    assert np.all(g.numpy()[:, 9:] == 0)


def test_routes_in_float32_match_the_numpy_reference():
    X = np.random.default_rng(0).standard_normal((2, 300, 2))
    lti = LinearSSM.random(3, 2, 2, spectral_radius=0.9, seed=0, dtype=torch.float32)
    sel = SelectiveSSM.random(2, 3, seed=0, dtype=torch.float32)
    for model, methods in ((lti, ("recurrence", "scan", "auto")), (sel, ("recurrence", "scan", "auto"))):
        expected = ref.forward(model, X)  # float64, from the float32 parameters
        for method in methods:
            Y = model(X, method=method)
            assert Y.dtype == np.float32
            np.testing.assert_allclose(Y, expected, rtol=1e-4, atol=1e-5)
