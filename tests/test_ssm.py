"""LinearSSM, discretisation, SelectiveSSM and SSD against independent formulas (lib.ssm)."""

import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import SSD, LinearSSM, SelectiveSSM, interaction_rank, relative_error

FAST = settings(max_examples=15, deadline=None)
mpow = np.linalg.matrix_power


def softplus(x):
    return np.logaddexp(0.0, x)


# -- LinearSSM --------------------------------------------------------------


@FAST
@given(n=st.integers(1, 7), N=st.integers(1, 4), d=st.integers(1, 3), p=st.integers(1, 3), seed=st.integers(0, 999))
def test_prop_lti_ssm_operator_is_block_toeplitz_C_A_pow_l_B(n, N, d, p, seed):
    model = LinearSSM.random(N, d, p, spectral_radius=1.1, seed=seed)
    A, B, C = model.A, model.B, model.C
    W = model.operator(np.random.default_rng(seed).standard_normal((n, d)))
    for i in range(n):
        for j in range(n):
            expected = C @ mpow(A, i - j) @ B if j <= i else np.zeros((p, d))
            np.testing.assert_allclose(W[i, j], expected, rtol=1e-12, atol=1e-14)


def test_prop_lti_ssm_lags_are_C_A_pow_l_B():
    model = LinearSSM.random(5, 3, 2, spectral_radius=0.97, seed=4)
    A, B, C = model.A, model.B, model.C
    L = model.lags(300)
    assert L.shape == (300, 2, 3)
    for ell in [0, 1, 2, 7, 64, 129, 299]:
        np.testing.assert_allclose(L[ell], C @ mpow(A, ell) @ B, rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(model.lags(1)[0], C @ B, rtol=1e-14)


def test_lags_are_fast_for_long_sequences():
    model = LinearSSM.random(64, 8, 8, seed=0)
    model.lags(64)  # warm up
    seconds = []
    for _ in range(3):  # best of three: robust to a busy machine
        start = time.perf_counter()
        L = model.lags(16384)
        seconds.append(time.perf_counter() - start)
    assert min(seconds) < 1.0 and L.shape == (16384, 8, 8)


def test_prop_lti_ssm_operator_does_not_depend_on_the_input():
    model = LinearSSM.random(3, 2, 2, seed=0)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(model.operator(rng.standard_normal((6, 2))), model.operator(rng.standard_normal((6, 2))))


def test_prop_lti_ssm_interaction_rank_at_most_min_N_pd():
    rng = np.random.default_rng(0)
    for N, d, p in [(1, 2, 2), (2, 3, 3), (3, 2, 2), (6, 2, 2), (5, 1, 2)]:
        model = LinearSSM.random(N, d, p, seed=N)
        X = rng.standard_normal((12, d))
        # Independently: rank of the 12 × pd matrix of vec(C A^ℓ B).
        stacked = np.array([(model.C @ mpow(model.A, ell) @ model.B).ravel() for ell in range(12)])
        k = np.linalg.matrix_rank(stacked)
        assert interaction_rank(model, X) == k <= min(N, p * d)
    assert interaction_rank(LinearSSM.damped_rotation(0.9, 0.3), rng.standard_normal((5, 2))) == 2


@pytest.mark.parametrize("method", ["recurrence", "fft", "scan", "auto"])
@pytest.mark.parametrize("N,d,p,n,b", [(1, 1, 1, 1, 1), (1, 2, 3, 5, 2), (4, 3, 2, 1, 3), (3, 2, 2, 64, 1),
                                       (5, 2, 3, 130, 2), (8, 3, 1, 1000, 1)])
def test_lti_forward_routes_agree_with_explicit_sum(method, N, d, p, n, b):
    model = LinearSSM.random(N, d, p, spectral_radius=0.99, seed=n)
    X = np.random.default_rng(N).standard_normal((b, n, d))
    L = np.array([model.C @ mpow(model.A, ell) @ model.B for ell in range(n)])
    expected = np.stack([np.array([sum(L[i - j] @ x[j] for j in range(i + 1)) for i in range(n)]) for x in X]) \
        if n <= 130 else model(X, method="recurrence")
    Y = model(X, method=method)
    assert relative_error(Y, expected) <= 1e-12
    assert relative_error(model(X[0], method=method), expected[0]) <= 1e-12


@pytest.mark.parametrize("method", ["recurrence", "fft", "scan"])
def test_lti_forward_routes_are_differentiable(method):
    model = LinearSSM.random(3, 2, 2, seed=0)
    X = torch.tensor(np.random.default_rng(0).standard_normal((70, 2)), requires_grad=True)
    model(X, method=method)[50].sum().backward()
    g = X.grad.numpy()
    # ∂(Σ y_50)/∂x_j = 1ᵀ C A^{50−j} B for j ≤ 50, 0 after.
    for j in [0, 20, 50]:
        np.testing.assert_allclose(g[j], np.ones(2) @ model.C @ mpow(model.A, 50 - j) @ model.B, rtol=1e-10, atol=1e-14)
    assert np.abs(g[51:]).max() < 1e-13


def test_lti_method_is_validated():
    with pytest.raises(ValueError, match="method must be one of"):
        LinearSSM.random(2, 2, 2)(np.zeros((3, 2)), method="magic")


def test_lti_constructors():
    model = LinearSSM.random(6, 2, 3, spectral_radius=0.8, seed=1)
    assert (model.N, model.d, model.p) == (6, 2, 3)
    assert model.spectral_radius == pytest.approx(0.8, rel=1e-12)
    assert model.spectral_radius == pytest.approx(np.abs(np.linalg.eigvals(model.A)).max(), rel=1e-12)

    rot = LinearSSM.damped_rotation(0.9, np.pi / 5)
    L = rot.lags(4)
    for ell in range(4):
        c, s = np.cos(ell * np.pi / 5), np.sin(ell * np.pi / 5)
        np.testing.assert_allclose(L[ell], 0.9**ell * np.array([[c, -s], [s, c]]), atol=1e-15)

    eig = np.array([0.5, 0.8 * np.exp(1j * 0.7), -0.3, 0.8 * np.exp(-1j * 0.7)])
    rng = np.random.default_rng(0)
    model = LinearSSM.diagonal(eig, rng.standard_normal((4, 2)), rng.standard_normal((1, 4)))
    assert np.allclose(model.A, np.triu(np.tril(model.A, 1), -1))  # block diagonal, real
    got = np.sort_complex(np.linalg.eigvals(model.A))
    np.testing.assert_allclose(got, np.sort_complex(eig), atol=1e-14)
    with pytest.raises(ValueError, match="closed under complex conjugation"):
        LinearSSM.diagonal([0.5j, 0.3], np.zeros((2, 1)), np.zeros((1, 2)))


# -- discretisation ---------------------------------------------------------


def test_prop_discretisation_bilinear_matches_formula():
    rng = np.random.default_rng(0)
    A_c, B_c, C_c = rng.standard_normal((4, 4)) - 2 * np.eye(4), rng.standard_normal((4, 2)), rng.standard_normal((3, 4))
    step = 0.1
    model = LinearSSM.from_continuous(A_c, B_c, C_c, step, method="bilinear")
    inverse = np.linalg.inv(np.eye(4) - step / 2 * A_c)
    np.testing.assert_allclose(model.A, inverse @ (np.eye(4) + step / 2 * A_c), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(model.B, inverse @ (step * B_c), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(model.C, C_c)


def test_prop_discretisation_zoh_scalar_closed_form():
    a, b, c, step = -0.7, 1.3, 2.0, 0.25
    model = LinearSSM.from_continuous([[a]], [[b]], [[c]], step, method="zoh")
    assert model.A[0, 0] == pytest.approx(np.exp(a * step), rel=1e-14)
    assert model.B[0, 0] == pytest.approx((np.exp(a * step) - 1) / a * b, rel=1e-13)


def test_prop_discretisation_zoh_matches_eigendecomposition():
    rng = np.random.default_rng(1)
    A_c, B_c = rng.standard_normal((3, 3)), rng.standard_normal((3, 2))
    step = 0.3
    model = LinearSSM.from_continuous(A_c, B_c, np.eye(3), step, method="zoh")
    lam, V = np.linalg.eig(A_c)
    Vinv = np.linalg.inv(V)
    A = (V @ np.diag(np.exp(step * lam)) @ Vinv).real
    B = (V @ np.diag((np.exp(step * lam) - 1) / lam) @ Vinv @ B_c).real  # A_c^{-1}(e^{ΔA_c} − I) B_c
    np.testing.assert_allclose(model.A, A, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(model.B, B, rtol=1e-11, atol=1e-13)


def test_prop_discretisation_zoh_singular_A_c():
    step = 0.4
    nilpotent = np.array([[0.0, 1.0], [0.0, 0.0]])
    B_c = np.array([[1.0], [2.0]])
    model = LinearSSM.from_continuous(nilpotent, B_c, np.eye(2), step, method="zoh")
    np.testing.assert_allclose(model.A, np.eye(2) + step * nilpotent, atol=1e-15)
    np.testing.assert_allclose(model.B, (step * np.eye(2) + step**2 / 2 * nilpotent) @ B_c, atol=1e-15)
    zero = LinearSSM.from_continuous(np.zeros((2, 2)), B_c, np.eye(2), step, method="zoh")
    np.testing.assert_allclose(zero.B, step * B_c, atol=1e-15)


def test_prop_discretisation_zoh_samples_the_continuous_impulse_response():
    # With a constant input held over each step, the discrete SSM equals the ODE solution at the samples.
    A_c, B_c = np.array([[-0.5, 2.0], [-2.0, -0.5]]), np.array([[1.0], [0.0]])
    step, steps = 0.05, 40
    model = LinearSSM.from_continuous(A_c, B_c, np.eye(2), step, method="zoh")
    y = model(np.ones((steps, 1)))
    # Fine explicit integration (RK4) of ṡ = A_c s + B_c, s(0) = 0.
    s, h = np.zeros(2), step / 200
    f = lambda s: A_c @ s + B_c[:, 0]
    for _ in range(steps * 200):
        k1 = f(s); k2 = f(s + h / 2 * k1); k3 = f(s + h / 2 * k2); k4 = f(s + h * k3)
        s = s + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    np.testing.assert_allclose(y[-1], s, rtol=1e-9)


def test_discretisation_validates_arguments():
    with pytest.raises(ValueError, match="step must be > 0"):
        LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), 0.0)
    with pytest.raises(ValueError, match="method must be one of"):
        LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), 0.1, method="euler")
    with pytest.raises(ValueError, match="singular"):
        LinearSSM.from_continuous(20 * np.eye(2), np.eye(2), np.eye(2), 0.1)


# -- SelectiveSSM -----------------------------------------------------------


def numpy_selective(model, X):
    """Δ, B_t, C_t and the mamba selective_scan_ref loop, in numpy."""
    delta = softplus(X @ model.W_delta.T + model.b_delta)
    Bt, Ct = X @ model.W_B.T, X @ model.W_C.T
    A = -np.exp(model.A_log)
    h, Y = np.zeros((model.d, model.N)), []
    for t in range(len(X)):
        h = np.exp(delta[t][:, None] * A) * h + (delta[t] * X[t])[:, None] * Bt[t][None, :]
        Y.append(h @ Ct[t])
    return delta, Bt, Ct, np.array(Y)


@FAST
@given(n=st.integers(1, 7), d=st.integers(1, 3), N=st.integers(1, 4), seed=st.integers(0, 999))
def test_prop_selective_ssm_operator_is_C_i_A_i_down_to_A_j1_B_j(n, d, N, seed):
    model = SelectiveSSM.random(d, N, step_range=(0.1, 2.0), seed=seed)
    X = np.random.default_rng(seed).standard_normal((n, d))
    delta, Bt, Ct, Y = numpy_selective(model, X)
    np.testing.assert_allclose(model(X, method="recurrence"), Y, rtol=1e-12, atol=1e-14)
    A = -np.exp(model.A_log)
    W = model.operator(X)
    for i in range(n):
        for j in range(n):
            if j > i:
                assert np.all(W[i, j] == 0)
                continue
            for c in range(d):
                # A_t = diag(exp(Δ_t[c] A[c])) for the channel; product over t = j+1..i.
                product = np.ones(N)
                for t in range(j + 1, i + 1):
                    product = product * np.exp(delta[t, c] * A[c])
                assert W[i, j, c, c] == pytest.approx(Ct[i] @ (product * delta[j, c] * Bt[j]), rel=1e-10, abs=1e-14)
            assert np.all(W[i, j][~np.eye(d, dtype=bool)] == 0)  # diagonal in channels
    sel = model.selection(X)
    np.testing.assert_allclose(sel[0], delta, rtol=1e-13)
    np.testing.assert_allclose(sel[1], Bt, rtol=1e-13)


@pytest.mark.parametrize("n,step_range,b", [(1, (0.1, 1.0), 1), (5, (0.1, 1.0), 2), (2000, (0.5, 5.0), 2),
                                            (2000, (1e-3, 1e-1), 1), (3001, (20.0, 50.0), 1)])
def test_selective_scan_agrees_with_loop_and_survives_strong_decay(n, step_range, b):
    model = SelectiveSSM.random(3, 16, step_range=step_range, seed=n)
    X = np.random.default_rng(n).standard_normal((b, n, 3)) * 2
    loop, scan = model(X, method="recurrence"), model(X, method="scan")
    assert np.all(np.isfinite(scan))
    assert relative_error(scan, loop) <= 1e-10
    np.testing.assert_array_equal(model(X), scan)  # the default is the scan


def test_selective_operator_is_finite_for_strong_decay():
    model = SelectiveSSM.random(2, 8, step_range=(50.0, 100.0), seed=0)
    X = np.random.default_rng(0).standard_normal((200, 2))
    W = model.operator(X)
    assert np.all(np.isfinite(W))
    assert relative_error(np.einsum("ijpd,jd->ip", W, X), model(X)) <= 1e-10


def test_selective_scan_is_differentiable():
    model = SelectiveSSM.random(2, 4, seed=0)
    X = torch.tensor(np.random.default_rng(0).standard_normal((40, 2)), requires_grad=True)
    (g_scan,) = torch.autograd.grad(model(X, method="scan")[30].sum(), X)
    (g_loop,) = torch.autograd.grad(model(X, method="recurrence")[30].sum(), X)
    np.testing.assert_allclose(g_scan.numpy(), g_loop.numpy(), rtol=1e-10, atol=1e-14)
    assert np.all(g_scan.numpy()[31:] == 0)


# -- SSD --------------------------------------------------------------------


def numpy_ssd(model, X, A_log, W_delta, b_delta, W_B, W_C):
    H, d = W_delta.shape
    dh = d // H
    delta = softplus(X @ W_delta.T + b_delta)  # (n, H)
    a = np.exp(delta * -np.exp(A_log))
    Bt, Ct = X @ W_B.T, X @ W_C.T
    h = np.zeros((H, W_B.shape[0], dh))
    Y = []
    for t in range(len(X)):
        outs = []
        for k in range(H):
            h[k] = a[t, k] * h[k] + np.outer(Bt[t], delta[t, k] * X[t, k * dh:(k + 1) * dh])
            outs.append(h[k].T @ Ct[t])
        Y.append(model.W_O @ np.concatenate(outs))
    return delta, a, Bt, Ct, np.array(Y)


def ssd_parameters(d, p, N, H, seed):
    rng = np.random.default_rng(seed)
    return (np.log(rng.uniform(0.5, 4, H)), rng.standard_normal((H, d)) / np.sqrt(d), rng.uniform(-1, 1, H),
            rng.standard_normal((N, d)), rng.standard_normal((N, d)), rng.standard_normal((p, d)))


@FAST
@given(n=st.integers(1, 6), H=st.integers(1, 3), dh=st.integers(1, 2), p=st.integers(1, 3), N=st.integers(1, 3),
       seed=st.integers(0, 999))
def test_prop_ssd_operator_is_factorized_with_V_h_equal_W_O_P_h(n, H, dh, p, N, seed):
    d = H * dh
    params = ssd_parameters(d, p, N, H, seed)
    model = SSD(*params)
    X = np.random.default_rng(seed).standard_normal((n, d))
    delta, a, Bt, Ct, Y = numpy_ssd(model, X, *params[:5])
    np.testing.assert_allclose(model(X, method="recurrence"), Y, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(model(X, method="scan"), Y, rtol=1e-10, atol=1e-13)
    W_O = params[5]
    V = np.zeros((H, p, d))
    for k in range(H):
        V[k][:, k * dh:(k + 1) * dh] = W_O[:, k * dh:(k + 1) * dh]  # W_O P_h
    np.testing.assert_array_equal(model.values(), V)
    W = model.operator(X)
    for i in range(n):
        for j in range(n):
            expected = sum(Ct[i] @ Bt[j] * delta[j, k] * np.prod(a[j + 1:i + 1, k]) * V[k] for k in range(H)) \
                if j <= i else np.zeros((p, d))
            np.testing.assert_allclose(W[i, j], expected, rtol=1e-10, atol=1e-13)


def test_prop_ssd_single_head_interaction_rank_is_one():
    model = SSD.random(4, 3, N=5, heads=1, step_range=(0.1, 1.0), seed=0)
    X = np.random.default_rng(0).standard_normal((3, 10, 4))
    assert interaction_rank(model, X) == 1


def test_prop_ssd_interaction_rank_at_most_heads():
    X = np.random.default_rng(1).standard_normal((3, 10, 6))
    for H in (1, 2, 3, 6):
        model = SSD.random(6, 6, N=4, heads=H, step_range=(0.1, 1.0), seed=H)
        assert interaction_rank(model, X) == H  # generic W_O: exactly H


def test_ssd_rejects_heads_not_dividing_d():
    with pytest.raises(ValueError, match=r"A_log must have shape \(H,\) with H dividing d"):
        SSD(*ssd_parameters(5, 2, 3, 2, 0))


# -- prop-structured-dynamics -------------------------------------------------------------

def test_prop_structured_dynamics_unrolled_recurrence_equals_the_product_formula():
    # Time-varying A_t, B_t, C_t (numpy): s_i = A_i s_{i-1} + B_i x_i, y_i = C_i s_i against
    # y_i = Σ_{j≤i} C_i A_i⋯A_{j+1} B_j x_j, computed independently.
    rng = np.random.default_rng(5)
    n, N, d, p = 7, 3, 2, 2
    A = 0.5 * rng.standard_normal((n, N, N))
    B, C = rng.standard_normal((n, N, d)), rng.standard_normal((n, p, N))
    X = rng.standard_normal((n, d))
    s, recurrence = np.zeros(N), []
    for i in range(n):
        s = A[i] @ s + B[i] @ X[i]
        recurrence.append(C[i] @ s)
    product = []
    for i in range(n):
        total = np.zeros(p)
        for j in range(i + 1):
            M = np.eye(N)
            for t in range(j + 1, i + 1):
                M = A[t] @ M
            total += C[i] @ M @ B[j] @ X[j]
        product.append(total)
    np.testing.assert_allclose(recurrence, product, rtol=1e-12, atol=1e-12)


def test_prop_structured_dynamics_lti_case_is_lib_operator():
    # The constant-matrix case of the formula is LinearSSM's operator, block by block.
    ssm = LinearSSM.random(3, 2, 2, seed=4)
    W = ssm.operator(np.zeros((5, 2)))
    for i in range(5):
        for j in range(5):
            expected = (ssm.C @ np.linalg.matrix_power(ssm.A, i - j) @ ssm.B) if j <= i else np.zeros((2, 2))
            np.testing.assert_allclose(W[i, j], expected, rtol=1e-12, atol=1e-14)
