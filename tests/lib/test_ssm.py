"""LinearSSM, discretisation, SelectiveSSM, SSD, S4D's and S5's layers and the S4D-style SSMs (lib.ssm).

The references are plain numpy (the `reference` package, which imports nothing from lib): the
chapter's formulas transcribed with loops, a convolution with lags formed by repeated
multiplication, Runge–Kutta integration of the continuous system, explicit inverses, complex
loops for the diagonal layers, central differences for gradients.
"""

import functools

import numpy as np
import pytest
import torch

import reference as ref
from lib import (SSD, DiagonalSSM, ElmanRNN, LinearSSM, SelectiveSSM, SharedStateSSM, interaction_rank,
                 relative_error, s4d_continuous, s4d_ssm, s4d_step)

mpow = np.linalg.matrix_power
F64 = torch.float64


def t(a):
    return torch.from_numpy(np.asarray(a, dtype=float))


def params(model, *names):
    return [getattr(model, name).numpy(force=True) for name in names]


def lti(model):
    return params(model, "A", "B", "C")


def selective(model):
    return params(model, "A_log", "W_delta", "dt_bias", "W_B", "W_C")


def ssd(model):
    return params(model, "A_log", "W_delta", "dt_bias", "W_B", "W_C", "W_O")


def call(model, X, **kwargs):
    """model(X) and model.operator(X) on a numpy X, as numpy."""
    with torch.no_grad():
        return model(t(X), **kwargs).numpy(), model.operator(t(X)).numpy()


def assert_matches_reference(model, forward, operator, n, seed, scale=30.0):
    """lib's forward pass and operator against the page's formulas, sequence by sequence, on every
    input family (random, zero tokens, constant, n = 1, n = 2, large entries), each item relative."""
    for family, X in ref.input_families(n, model.d, np.random.default_rng(seed), scale=scale).items():
        Y, W = call(model, X)
        for x, y, w in zip(X, Y, W):
            assert ref.itemwise_error(y, forward(x), 1) <= 1e-10, family
            assert ref.itemwise_error(w, operator(x), 2) <= 1e-10, family


# -- LinearSSM ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n,N,d,p,seed", [(1, 1, 1, 1, 0), (5, 3, 2, 3, 1), (7, 4, 3, 2, 2)])
def test_prop_lti_ssm_operator_is_block_toeplitz_C_A_pow_l_B(n, N, d, p, seed):
    model = LinearSSM.random(N, d, p, spectral_radius=1.1, seed=seed)
    A, B, C = lti(model)
    _, W = call(model, np.random.default_rng(seed).standard_normal((n, d)))
    for i in range(n):
        for j in range(n):
            expected = C @ mpow(A, i - j) @ B if j <= i else np.zeros((p, d))
            np.testing.assert_allclose(W[i, j], expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("N,d,p", [(1, 1, 1), (3, 2, 4), (4, 3, 2)])
def test_prop_lti_ssm_matches_the_reference_on_adversarial_inputs(N, d, p):
    model = LinearSSM.random(N, d, p, spectral_radius=0.95, seed=N + d)
    A, B, C = lti(model)
    assert_matches_reference(model, lambda x: ref.lti_forward(A, B, C, x), lambda x: ref.lti_operator(A, B, C, len(x)),
                             9, seed=p)


def test_prop_lti_ssm_lags_are_C_A_pow_l_B():
    model = LinearSSM.random(5, 3, 2, spectral_radius=0.97, seed=4)
    A, B, C = lti(model)
    L = model.lags(300).numpy(force=True)
    assert L.shape == (300, 2, 3)
    np.testing.assert_allclose(L, ref.lti_lags(A, B, C, 300), rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(model.lags(1).numpy(force=True)[0], C @ B, rtol=1e-14)
    # The operator is the same for every input.
    rng = np.random.default_rng(0)
    first, second = (call(model, rng.standard_normal((6, 3)))[1] for _ in range(2))
    np.testing.assert_array_equal(first, second)


def nilpotent_ssm():
    # A ≠ 0 with A² = 0: only L_0 = CB and L_1 = CAB are non-zero, so k = 2 on any n >= 2 (1 on n = 1).
    rng = np.random.default_rng(3)
    A = np.zeros((4, 4))
    A[0, 1] = 1.0
    return LinearSSM(A, rng.standard_normal((4, 2)), rng.standard_normal((3, 4)))


@pytest.mark.parametrize("model,n", [
    (LinearSSM.random(1, 2, 2, seed=1), 12), (LinearSSM.random(2, 3, 3, seed=2), 12),
    (LinearSSM.random(6, 2, 2, seed=6), 12), (LinearSSM.random(5, 1, 2, seed=5), 12),
    (LinearSSM.random(6, 3, 3, seed=7), 3),                       # n < N: k = n
    (nilpotent_ssm(), 1), (nilpotent_ssm(), 6),                   # k = 1, then 2
    (LinearSSM(np.eye(3), np.ones((3, 2)), np.zeros((2, 3))), 5),  # C = 0: k = 0
    (LinearSSM.damped_rotation(0.9, 0.3), 5),                     # two lags span {I, R(π/2)}: k = 2
], ids=["N=1", "N=2", "N=6>pd", "d=1", "n<N", "nilpotent n=1", "nilpotent n=6", "C=0", "rotation"])
def test_prop_lti_ssm_interaction_rank_equals_k_from_numpy_lags(model, n):
    X = np.random.default_rng(n).standard_normal((2, n, model.d))
    k = ref.numerical_rank(ref.lti_lags(*lti(model), n))
    assert interaction_rank(model, X) == k <= min(model.N, n, model.p * model.d)


def test_prop_lti_ssm_rank_examples_have_the_k_worked_out_by_hand():
    nilpotent = nilpotent_ssm()
    assert [interaction_rank(nilpotent, np.ones((n, 2))) for n in (1, 2, 6)] == [1, 2, 2]
    assert interaction_rank(LinearSSM(np.eye(3), np.ones((3, 2)), np.zeros((2, 3))), np.ones((4, 2))) == 0
    assert interaction_rank(LinearSSM.damped_rotation(0.9, 0.3), np.ones((5, 2))) == 2


# (N, d, p, n, b): n = 1, N = 1, p ≠ d both ways, batches; n on the scan's chunk edges (T = 64)
# and on the "auto" switch (256/257), and long.
LTI_CASES = [(1, 1, 1, 1, 1), (1, 3, 2, 1, 4), (2, 1, 3, 2, 1), (1, 2, 1, 63, 2), (3, 2, 3, 64, 1),
             (2, 3, 1, 65, 3), (4, 2, 2, 129, 2), (2, 1, 2, 256, 1), (2, 2, 1, 257, 2), (8, 3, 1, 1000, 1)]


@pytest.mark.parametrize("N,d,p,n,b", LTI_CASES)
def test_lti_forward_routes_agree_with_the_convolution_by_lags(N, d, p, n, b):
    # Independent route: y_i = Σ_ℓ L_ℓ x_{i−ℓ} with L_ℓ = C A^ℓ B by repeated multiplication (numpy).
    model = LinearSSM.random(N, d, p, spectral_radius=0.99, seed=n)
    X = np.random.default_rng(N * n).standard_normal((b, n, d))
    expected = np.stack([ref.lti_convolution(*lti(model), x) for x in X])
    with torch.no_grad():
        for method in ("recurrence", "scan", "auto"):
            Y = model(t(X), method=method)
            assert Y.shape == (b, n, p)
            assert relative_error(Y, expected) <= 1e-12, method
            assert relative_error(model(t(X[-1]), method=method), expected[-1]) <= 1e-12, method


def test_forward_routes_in_float32_match_the_numpy_reference():
    X = np.random.default_rng(0).standard_normal((2, 300, 2))
    lti_model = LinearSSM.random(3, 2, 2, spectral_radius=0.9, seed=0, dtype=torch.float32)
    selective_model = SelectiveSSM.random(2, 3, seed=0, dtype=torch.float32)
    cases = [(lti_model, lambda x: ref.lti_forward(*lti(lti_model), x)),  # float64 from the float32 parameters
             (selective_model, lambda x: ref.selective_forward(*selective(selective_model), x))]
    for model, forward in cases:
        expected = np.stack([forward(x) for x in X])
        for method in ("recurrence", "scan", "auto"):
            with torch.no_grad():
                Y = model(t(X).float(), method=method)
            assert Y.dtype == torch.float32
            np.testing.assert_allclose(Y.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_lti_routes_keep_tiny_outputs_to_relative_accuracy():
    # Why LinearSSM has no FFT route: an FFT's rounding error is absolute (~1e-16 of the largest
    # output), so an impulse response decaying below that is lost; the loop and the scan keep
    # every entry to relative accuracy.
    model = LinearSSM.random(4, 2, 2, spectral_radius=0.5, seed=0)
    for n in (100, 300):  # the loop, then the scan under "auto"
        X = np.zeros((n, 2))
        X[0, 0] = 1.0  # y_i = L_i e_0
        L = ref.lti_lags(*lti(model), n)[:, :, 0]
        assert np.abs(L[-1]).max() < 1e-25
        for method in ("recurrence", "scan", "auto"):
            np.testing.assert_allclose(model(t(X), method=method).numpy(force=True), L, rtol=1e-10, atol=0)


@pytest.mark.parametrize("method", ["recurrence", "scan"])
def test_lti_forward_routes_are_differentiable(method):
    model = LinearSSM.random(3, 2, 2, seed=0)
    A, B, C = lti(model)
    X = t(np.random.default_rng(0).standard_normal((70, 2))).requires_grad_()
    (g,) = torch.autograd.grad(model(X, method=method)[50].sum(), X)
    # ∂(Σ y_50)/∂x_j = 1ᵀ C A^{50−j} B for j <= 50, 0 after.
    for j in [0, 20, 50]:
        np.testing.assert_allclose(g[j].numpy(), np.ones(2) @ C @ mpow(A, 50 - j) @ B, rtol=1e-10, atol=1e-14)
    assert g[51:].abs().max() < 1e-13


def test_lti_constructors():
    model = LinearSSM.random(6, 2, 3, spectral_radius=0.8, seed=1)
    assert (model.N, model.d, model.p) == (6, 2, 3)
    assert model.spectral_radius == pytest.approx(0.8, rel=1e-12)
    assert model.spectral_radius == pytest.approx(np.abs(np.linalg.eigvals(lti(model)[0])).max(), rel=1e-12)

    L = LinearSSM.damped_rotation(0.9, np.pi / 5).lags(4).numpy(force=True)
    for ell in range(4):
        c, s = np.cos(ell * np.pi / 5), np.sin(ell * np.pi / 5)
        np.testing.assert_allclose(L[ell], 0.9**ell * np.array([[c, -s], [s, c]]), atol=1e-15)

    eig = np.array([0.5, 0.8 * np.exp(1j * 0.7), -0.3, 0.8 * np.exp(-1j * 0.7)])
    rng = np.random.default_rng(0)
    for values in (eig, torch.from_numpy(eig)):
        A = lti(LinearSSM.diagonal(values, rng.standard_normal((4, 2)), rng.standard_normal((1, 4))))[0]
        assert np.allclose(A, np.triu(np.tril(A, 1), -1))  # block diagonal, real
        np.testing.assert_allclose(np.sort_complex(np.linalg.eigvals(A)), np.sort_complex(eig), atol=1e-14)
    assert lti(LinearSSM.diagonal([2, -1], np.ones((2, 1)), np.ones((1, 2))))[0].tolist() == [[2, 0], [0, -1]]


@pytest.mark.parametrize("call_,error,match", [
    (lambda: LinearSSM.diagonal([0.5j, 0.3], np.zeros((2, 1)), np.zeros((1, 2))), ValueError,
     "eigenvalues must be closed under conjugation"),
    (lambda: LinearSSM.diagonal("abc", np.zeros((1, 1)), np.zeros((1, 1))), TypeError,
     "eigenvalues must be real or complex numbers"),
    (lambda: LinearSSM.diagonal(None, np.zeros((1, 1)), np.zeros((1, 1))), TypeError, "eigenvalues must be real"),
    (lambda: LinearSSM.diagonal([True], np.zeros((1, 1)), np.zeros((1, 1))), TypeError, "eigenvalues must be real"),
    (lambda: LinearSSM.diagonal(np.eye(2), np.zeros((2, 1)), np.zeros((1, 2))), ValueError,
     r"eigenvalues must be a finite array of shape \(N,\)"),
    (lambda: LinearSSM.diagonal([], np.zeros((1, 1)), np.zeros((1, 1))), ValueError, "eigenvalues must be a finite"),
    (lambda: LinearSSM.diagonal([np.nan], np.zeros((1, 1)), np.zeros((1, 1))), ValueError, "eigenvalues must be a"),
    (lambda: LinearSSM.diagonal([0.5, 0.2], np.zeros((1, 1)), np.zeros((1, 1))), ValueError, r"B must have shape"),
    (lambda: LinearSSM.damped_rotation(-0.1, 0.3), ValueError, "radius must be finite and in"),
    (lambda: LinearSSM.damped_rotation(0.9, np.inf), ValueError, "angle must be finite"),
    (lambda: LinearSSM.damped_rotation(0.9, "0.3"), TypeError, "angle must be a real number"),
    (lambda: LinearSSM.random(2, 2, 2, spectral_radius=-1.0), ValueError, "spectral_radius must be finite and in"),
    (lambda: LinearSSM.random(2, 2, 2, spectral_radius="big"), TypeError, "spectral_radius must be a real number"),
    (lambda: LinearSSM.random(2, 2, 2)(torch.zeros(3, 2, dtype=F64), method="magic"), ValueError,
     "method must be one of 'auto', 'recurrence', 'scan'; got 'magic'"),
    (lambda: LinearSSM.random(2, 2, 2).lags(0), ValueError, "n must be >= 1"),
    (lambda: LinearSSM.random(2, 2, 2).lags(2.0), TypeError, "n must be an integer"),
    (lambda: LinearSSM.random(2, 2, 2).lags(True), TypeError, "n must be an integer"),
])
def test_lti_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()


# -- discretisation -----------------------------------------------------------------------------


def continuous_systems():
    """(kind, A_c, B_c, C): Hurwitz, singular (rank N − 1), nilpotent, zero, and an unstable one."""
    rng = np.random.default_rng(11)
    systems = ref.continuous_systems(4, 2, 3, rng, hurwitz=1, singular=1)
    return systems + [("unstable", rng.standard_normal((4, 4)), rng.standard_normal((4, 2)),
                       rng.standard_normal((3, 4)))]


SYSTEMS = continuous_systems()
STEPS = (0.01, 0.3, 1.0)


@pytest.mark.parametrize("kind,A_c,B_c,C", SYSTEMS, ids=[s[0] for s in SYSTEMS])
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("method", ["zoh", "bilinear"])
def test_prop_discretisation_matches_an_independent_route_also_for_singular_A_c(kind, A_c, B_c, C, step, method):
    # zoh: Ā and B̄ = Δ φ₁(ΔA_c) B_c against Runge–Kutta integration of ṡ = A_c s + B_c x over one
    # step; bilinear: against the explicit inverse (I − Δ/2 A_c)⁻¹.
    A, B, C_out = lti(LinearSSM.from_continuous(A_c, B_c, C, step, method=method))
    A_bar, B_bar = (ref.rk4_flow if method == "zoh" else ref.bilinear)(A_c, B_c, step)
    assert ref.column_error(A, A_bar) <= 1e-12
    assert ref.column_error(B, B_bar) <= 1e-12
    np.testing.assert_array_equal(C_out, C)


@pytest.mark.parametrize("kind,A_c,B_c,C", SYSTEMS[:2], ids=[s[0] for s in SYSTEMS[:2]])
def test_prop_discretisation_zoh_outputs_are_the_samples_under_held_inputs(kind, A_c, B_c, C):
    # y_i = C s(iΔ) when x(t) = x_i on ((i−1)Δ, iΔ] and s(0) = 0 (RK4 through the whole sequence).
    step = 0.3
    X = np.random.default_rng(1).standard_normal((4, 2))
    Y, _ = call(LinearSSM.from_continuous(A_c, B_c, C, step, method="zoh"), X)
    assert ref.itemwise_error(Y, ref.held_input_samples(A_c, B_c, C, step, X), 1) <= 1e-10


def test_prop_discretisation_zoh_closed_forms():
    # Scalar: B̄ = (e^{aΔ} − 1)/a · b, the A_c⁻¹ form; nilpotent N: B̄ = (ΔI + Δ²/2 N) B_c exactly;
    # A_c = 0: B̄ = Δ B_c, where the A_c⁻¹ form is undefined.
    a, b, step = -0.7, 1.3, 0.25
    A, B, _ = lti(LinearSSM.from_continuous([[a]], [[b]], [[2.0]], step, method="zoh"))
    assert A[0, 0] == pytest.approx(np.exp(a * step), rel=1e-14)
    assert B[0, 0] == pytest.approx((np.exp(a * step) - 1) / a * b, rel=1e-13)
    nilpotent, B_c = np.array([[0.0, 1.0], [0.0, 0.0]]), np.array([[1.0], [2.0]])
    A, B, _ = lti(LinearSSM.from_continuous(nilpotent, B_c, np.eye(2), 0.4, method="zoh"))
    np.testing.assert_allclose(A, np.eye(2) + 0.4 * nilpotent, atol=1e-15)
    np.testing.assert_allclose(B, (0.4 * np.eye(2) + 0.4**2 / 2 * nilpotent) @ B_c, atol=1e-15)
    _, B, _ = lti(LinearSSM.from_continuous(np.zeros((2, 2)), B_c, np.eye(2), 0.4, method="zoh"))
    np.testing.assert_allclose(B, 0.4 * B_c, atol=1e-15)


def test_prop_discretisation_zoh_matches_the_inverse_form_when_A_c_is_invertible():
    rng = np.random.default_rng(1)
    A_c, B_c, step = rng.standard_normal((3, 3)), rng.standard_normal((3, 2)), 0.3
    A, B, _ = lti(LinearSSM.from_continuous(A_c, B_c, np.eye(3), step, method="zoh"))
    lam, V = np.linalg.eig(A_c)
    Vinv = np.linalg.inv(V)
    np.testing.assert_allclose(A, (V @ np.diag(np.exp(step * lam)) @ Vinv).real, rtol=1e-11, atol=1e-13)
    # A_c⁻¹(e^{ΔA_c} − I) B_c
    np.testing.assert_allclose(B, (V @ np.diag((np.exp(step * lam) - 1) / lam) @ Vinv @ B_c).real,
                               rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("kind,A_c,B_c,C", SYSTEMS, ids=[s[0] for s in SYSTEMS])
@pytest.mark.parametrize("method", ["bilinear", "zoh"])
def test_prop_discretisation_maps_eigenvalues_and_keeps_Hurwitz_systems_stable(kind, A_c, B_c, C, method):
    for step in STEPS:
        model = LinearSSM.from_continuous(A_c, B_c, C, step, method=method)
        assert model.spectral_radius == pytest.approx(ref.mapped_spectral_radius(A_c, step, method), rel=1e-10)
        if kind == "Hurwitz":
            assert model.spectral_radius < 1
        if kind in ("singular", "nilpotent", "zero") and method == "zoh":
            assert model.spectral_radius >= 1 - 1e-12  # the eigenvalue 0 maps to e^0 = 1: not stable


@pytest.mark.parametrize("A_c,step", [
    (20 * np.eye(2), 0.1),                                                   # 2/Δ = 20, diagonal
    (np.array([[4.0, 1.0], [0.0, 4.0]]), 0.5),                               # a Jordan block at 2/Δ = 4
    ((lambda P: P @ np.diag([8.0, -1.0, 0.5]) @ np.linalg.inv(P))(
        np.random.default_rng(0).standard_normal((3, 3))), 0.25),            # similar to diag(2/Δ, ...)
])
def test_prop_discretisation_bilinear_is_undefined_when_2_over_step_is_an_eigenvalue(A_c, step):
    N = len(A_c)
    with pytest.raises(ValueError, match=r"A_c has the eigenvalue 2/step = .*: the bilinear rule is undefined"):
        LinearSSM.from_continuous(A_c, np.ones((N, 1)), np.ones((1, N)), step, method="bilinear")
    LinearSSM.from_continuous(A_c, np.ones((N, 1)), np.ones((1, N)), step, method="zoh")  # ZOH is defined


def test_discretisation_computes_in_the_requested_dtype_and_keeps_the_graph_of_torch_inputs():
    A_c = t([[-1.0, 0.5], [0.0, -2.0]]).requires_grad_()
    model = LinearSSM.from_continuous(A_c, np.eye(2), np.eye(2), 0.1, "zoh", dtype=torch.float32)
    assert model.dtype == torch.float32
    np.testing.assert_allclose(lti(model)[0], lti(LinearSSM.from_continuous(A_c.detach(), np.eye(2), np.eye(2),
                                                                            0.1, "zoh"))[0], rtol=1e-6)


@pytest.mark.parametrize("call_,error,match", [
    (lambda: LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), 0.0), ValueError,
     r"step must be finite and in \(0, inf\)"),
    (lambda: LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), -0.1), ValueError, "step must be finite"),
    (lambda: LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), np.inf), ValueError, "step must be finite"),
    (lambda: LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), "0.1"), TypeError, "step must be a real"),
    (lambda: LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), True), TypeError, "step must be a real"),
    (lambda: LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), 0.1, method="euler"), ValueError,
     "method must be one of 'bilinear', 'zoh'"),
    (lambda: LinearSSM.from_continuous(np.eye(2), np.eye(3), np.eye(2), 0.1), ValueError,
     r"B_c must have shape \(N, d\) = \(2, 3\)"),
    (lambda: LinearSSM.from_continuous(np.ones((2, 3)), np.eye(2), np.eye(2), 0.1), ValueError,
     r"A_c must have shape \(N, N\)"),
    (lambda: LinearSSM.from_continuous(np.eye(2), np.eye(2), np.ones(2), 0.1), ValueError, r"C_c must have shape"),
    (lambda: LinearSSM.from_continuous(np.full((2, 2), np.nan), np.eye(2), np.eye(2), 0.1), ValueError,
     "A_c must be finite"),
    (lambda: LinearSSM.from_continuous(np.eye(2, dtype=int), np.eye(2), np.eye(2), 0.1), TypeError,
     "A_c must have a real floating dtype"),
    (lambda: LinearSSM.from_continuous(np.eye(2), "B", np.eye(2), 0.1), TypeError,
     "B_c must be a torch tensor or numpy array"),
    (lambda: LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), 0.1, dtype="float32"), TypeError,
     "dtype must be torch.float32 or torch.float64"),
    (lambda: LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), 0.1, dtype=torch.int64), TypeError,
     "dtype must be torch.float32 or torch.float64"),
])
def test_discretisation_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()


# -- SelectiveSSM -------------------------------------------------------------------------------


@pytest.mark.parametrize("n,d,N,seed", [(1, 1, 1, 0), (4, 2, 3, 1), (7, 3, 4, 2)])
def test_prop_selective_ssm_operator_is_C_i_A_i_down_to_A_j1_B_j(n, d, N, seed):
    model = SelectiveSSM.random(d, N, step_range=(0.1, 2.0), seed=seed)
    P = selective(model)
    X = np.random.default_rng(seed).standard_normal((n, d))
    Y, W = call(model, X, method="recurrence")
    assert ref.itemwise_error(W, ref.selective_operator(*P, X), 2) <= 1e-10
    assert ref.itemwise_error(Y, ref.selective_forward(*P, X), 1) <= 1e-10
    assert np.all(W[:, :, ~np.eye(d, dtype=bool)] == 0)  # diagonal in channels
    _, delta, Bt, Ct = ref.selective_parts(*P, X)
    for got, expected in zip(model.selection(t(X)), (delta, Bt, Ct)):  # cancelling entries: vs the largest
        np.testing.assert_allclose(got.numpy(force=True), expected, rtol=1e-13, atol=1e-13 * np.abs(expected).max())


@pytest.mark.parametrize("d,N,steps", [(1, 1, (0.1, 1.0)), (3, 4, (0.1, 1.0)), (2, 16, (1e-3, 1e-1))])
def test_prop_selective_ssm_matches_the_reference_on_adversarial_inputs(d, N, steps):
    model = SelectiveSSM.random(d, N, step_range=steps, seed=d + N)
    P = selective(model)
    assert_matches_reference(model, lambda x: ref.selective_forward(*P, x), lambda x: ref.selective_operator(*P, x),
                             8, seed=N)


def test_prop_selective_ssm_interaction_rank_is_d_under_its_conditions_and_falls_when_they_fail():
    X = np.random.default_rng(0).standard_normal((4, 6, 3))
    model = SelectiveSSM.random(3, 4, step_range=(0.1, 1.0), seed=2)
    A_log, W_delta, dt_bias, W_B, W_C = selective(model)
    assert np.linalg.matrix_rank(W_delta) == 3 and ref.quadratic_form_nonzero(W_B, W_C)
    assert interaction_rank(model, X) == 3
    assert interaction_rank(model, X[:1, :3]) == 3  # d tokens suffice (almost surely)
    # W_Δ = 0 with equal biases: Δ_t is the same in every channel, and so is A[c] (S4D-real),
    # so every block is a multiple of the identity: rank 1 < d.
    assert interaction_rank(SelectiveSSM(A_log, np.zeros((3, 3)), np.full(3, 0.2), W_B, W_C), X) == 1
    # ω ≡ 0 (W_C = 0): every block vanishes.
    assert interaction_rank(SelectiveSSM(A_log, W_delta, dt_bias, W_B, np.zeros((4, 3))), X) == 0


@pytest.mark.parametrize("n,d,N,step_range,b", [
    (1, 1, 1, (0.05, 2.0), 1), (5, 3, 16, (0.1, 1.0), 2), (17, 2, 2, (0.05, 2.0), 2), (63, 1, 3, (0.05, 2.0), 1),
    (65, 3, 2, (0.05, 2.0), 2), (400, 1, 1, (0.05, 2.0), 1), (1000, 3, 16, (0.5, 5.0), 2),
    (1000, 3, 16, (1e-3, 1e-1), 1), (1001, 3, 16, (20.0, 50.0), 1)])
def test_selective_routes_agree_with_the_numpy_reference_and_survive_strong_decay(n, d, N, step_range, b):
    model = SelectiveSSM.random(d, N, step_range=step_range, seed=n)
    X = np.random.default_rng(n).standard_normal((b, n, d)) * 2
    expected = np.stack([ref.selective_forward(*selective(model), x) for x in X])
    with torch.no_grad():
        for method in ("recurrence", "scan", "auto"):
            Y = model(t(X), method=method)
            assert Y.shape == (b, n, d) and torch.isfinite(Y).all()
            assert relative_error(Y, expected) <= 1e-10, method


def test_selective_operator_is_finite_for_strong_decay():
    model = SelectiveSSM.random(2, 8, step_range=(50.0, 100.0), seed=0)
    X = np.random.default_rng(0).standard_normal((200, 2))
    _, W = call(model, X)
    assert np.all(np.isfinite(W))
    assert relative_error(np.einsum("ijpd,jd->ip", W, X), ref.selective_forward(*selective(model), X)) <= 1e-10
    assert ref.itemwise_error(W[:30, :30], ref.selective_operator(*selective(model), X[:30]), 2) <= 1e-10


ROUTE_MODELS = {
    "SelectiveSSM": (lambda: SelectiveSSM.random(2, 3, step_range=(0.1, 1.0), seed=0),
                     lambda m, x: ref.selective_forward(*selective(m), x)),
    "SSD": (lambda: SSD.random(4, 3, N=2, heads=2, step_range=(0.1, 1.0), seed=0),
            lambda m, x: ref.ssd_forward(*ssd(m), x)),
}
ROUTE_X = np.random.default_rng(0).standard_normal((2, 9, 4))  # sequences of 9 tokens, output 5 differentiated


@functools.cache
def reference_gradient(name):
    """∂(Σ_b Σ y_b,5)/∂X by central differences of the numpy reference (tokens 0..5 only: the rest is 0)."""
    make, forward = ROUTE_MODELS[name]
    model = make()
    X = ROUTE_X[:, :6, :model.d]
    g = ref.central_difference_gradient(lambda Z: sum(forward(model, z)[5].sum() for z in Z), X)
    return np.concatenate([g, np.zeros((2, 3, model.d))], 1)


@pytest.mark.parametrize("name,method", [("SelectiveSSM", "recurrence"), ("SelectiveSSM", "scan"),
                                         ("SSD", "recurrence"), ("SSD", "scan"), ("SSD", "quadratic")])
def test_selective_routes_have_the_gradients_of_the_numpy_reference(name, method):
    model = ROUTE_MODELS[name][0]()
    X = torch.from_numpy(ROUTE_X[..., :model.d].copy()).requires_grad_()
    (g,) = torch.autograd.grad(model(X, method=method)[:, 5].sum(), X)
    np.testing.assert_allclose(g.numpy(), reference_gradient(name), rtol=1e-6, atol=1e-9)
    assert np.all(g.numpy()[:, 6:] == 0)


@pytest.mark.parametrize("call_,error,match", [
    (lambda: SelectiveSSM(np.zeros((3, 2)), np.zeros((2, 3)), np.zeros(3), np.zeros((2, 3)), np.zeros((2, 3))),
     ValueError, r"W_delta must have shape \(d, d\) = \(3, 3\)"),
    (lambda: SelectiveSSM.random(3, 2, step_range=0.1), TypeError, r"step_range must be a pair"),
    (lambda: SelectiveSSM.random(3, 2, step_range=(0.1, 0.2, 0.3)), TypeError, r"step_range must be a pair"),
    (lambda: SelectiveSSM.random(3, 2, step_range=(0.0, 1.0)), ValueError, r"step_range\[0\] must be finite and in"),
    (lambda: SelectiveSSM.random(3, 2, step_range=(0.5, 0.1)), ValueError, r"step_range\[1\] must be finite and in"),
    (lambda: SelectiveSSM.random(3, 2, step_range=(0.1, np.inf)), ValueError, r"step_range\[1\] must be finite"),
    (lambda: SelectiveSSM.random(3, 2, step_range=("a", 1.0)), TypeError, r"step_range\[0\] must be a real number"),
    (lambda: SelectiveSSM.random(3, 2)(torch.zeros(4, 3, dtype=F64), method="quadratic"), ValueError,
     "method must be one of 'auto', 'recurrence', 'scan'"),
])
def test_selective_ssm_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()


# -- SSD ----------------------------------------------------------------------------------------


def ssd_parameters(d, p, N, H, seed):
    rng = np.random.default_rng(seed)
    return (np.log(rng.uniform(0.5, 4, H)), rng.standard_normal((H, d)) / np.sqrt(d), rng.uniform(-1, 1, H),
            rng.standard_normal((N, d)), rng.standard_normal((N, d)), rng.standard_normal((p, d)))


def ssd_reference_operator(P, X):
    return ref.factorized_operator(ref.ssd_coefficients(*P[:5], X), ref.ssd_values(P[5], len(P[0])))


@pytest.mark.parametrize("n,H,dh,p,N,seed", [(1, 1, 1, 1, 1, 0), (4, 2, 2, 3, 2, 1), (6, 3, 1, 2, 3, 2)])
def test_prop_ssd_operator_is_factorized_with_V_h_equal_W_O_P_h(n, H, dh, p, N, seed):
    d = H * dh
    P = ssd_parameters(d, p, N, H, seed)
    model = SSD(*P)
    for name, value in zip(("A_log", "W_delta", "dt_bias", "W_B", "W_C", "W_O"), P):
        np.testing.assert_array_equal(params(model, name)[0], value)
    X = np.random.default_rng(seed).standard_normal((n, d))
    for method in ("recurrence", "scan", "quadratic"):
        assert ref.itemwise_error(call(model, X, method=method)[0], ref.ssd_forward(*P, X), 1) <= 1e-10
    V = np.zeros((H, p, d))
    for k in range(H):
        V[k][:, k * dh:(k + 1) * dh] = P[5][:, k * dh:(k + 1) * dh]  # W_O P_h
    np.testing.assert_array_equal(model.values().numpy(force=True), V)
    assert ref.itemwise_error(call(model, X)[1], ssd_reference_operator(P, X), 2) <= 1e-10


@pytest.mark.parametrize("H,dh,p", [(1, 1, 1), (2, 2, 3), (3, 1, 2)])
def test_prop_ssd_matches_the_reference_on_adversarial_inputs(H, dh, p):
    model = SSD.random(H * dh, p, N=3, heads=H, step_range=(0.1, 1.0), seed=H + p)
    P = ssd(model)
    assert_matches_reference(model, lambda x: ref.ssd_forward(*P, x), lambda x: ssd_reference_operator(P, x),
                             8, seed=H)


def test_prop_ssd_interaction_rank_is_H_under_its_conditions():
    X = np.random.default_rng(1).standard_normal((3, 10, 6))
    for H in (1, 2, 3, 6):
        model = SSD.random(6, 6, N=4, heads=H, step_range=(0.1, 1.0), seed=H)
        _, W_delta, _, W_B, W_C, _ = ssd(model)
        assert np.linalg.matrix_rank(W_delta) == H and ref.quadratic_form_nonzero(W_B, W_C)
        alpha = np.concatenate([ref.ssd_coefficients(*ssd(model)[:5], x).reshape(H, -1).T for x in X])
        assert interaction_rank(model, X) == H == ref.numerical_rank(alpha)
        assert interaction_rank(model, X[:1, :H]) == H  # H tokens suffice (almost surely)


def test_prop_ssd_interaction_rank_falls_when_its_conditions_fail():
    A_log, W_delta, dt_bias, W_B, W_C, W_O = ssd_parameters(6, 4, 3, 3, 0)
    X = np.random.default_rng(2).standard_normal((3, 8, 6))
    dead = W_O.copy()
    dead[:, 2:4] = 0  # W_O P_2 = 0: head 2 contributes nothing
    assert interaction_rank(SSD(A_log, W_delta, dt_bias, W_B, W_C, dead), X) == 2
    assert interaction_rank(SSD(A_log, W_delta, dt_bias, W_B, np.zeros_like(W_C), W_O), X) == 0  # ω ≡ 0


@pytest.mark.parametrize("N,H,dh,p,n,b", [(1, 1, 1, 1, 1, 1), (1, 2, 1, 3, 1, 2), (2, 1, 2, 1, 5, 3),
                                          (3, 2, 2, 5, 16, 1), (1, 3, 1, 2, 33, 2), (2, 1, 1, 2, 65, 1),
                                          (2, 2, 1, 1, 300, 2)])
def test_ssd_routes_equal_the_numpy_recurrence(N, H, dh, p, n, b):
    model = SSD.random(H * dh, p, N=N, heads=H, step_range=(0.05, 2.0), seed=n)
    X = np.random.default_rng(n).standard_normal((b, n, H * dh))
    expected = np.stack([ref.ssd_forward(*ssd(model), x) for x in X])
    with torch.no_grad():
        for method in ("recurrence", "scan", "quadratic", "auto"):
            Y = model(t(X), method=method)
            assert Y.shape == (b, n, p)
            assert relative_error(Y, expected) <= 1e-10, method


@pytest.mark.parametrize("call_,error,match", [
    (lambda: SSD(*ssd_parameters(5, 2, 3, 2, 0)), ValueError, r"A_log must have shape \(H,\) with H dividing d = 5"),
    (lambda: SSD.random(3, 2, heads=2), ValueError, "H dividing d = 3"),
    (lambda: SSD.random(4, 2, heads=2)(torch.zeros(3, 4, dtype=F64), method="fft"), ValueError,
     "method must be one of 'auto', 'recurrence', 'scan', 'quadratic'"),
])
def test_ssd_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()


# -- prop-structured-dynamics: lib's operators are the product formula of their factors ------------


def structured_factors(model, X):
    """(A_i, B_i, C_i) of a model at X (n, d), as the chapter identifies them, in numpy: LTI SSM
    (A, B, C); Elman RNN (Φ_i W, Φ_i U, C); selective SSM and SSD with one N-dimensional state
    per channel (decays e^{Δ_t[q] A[q]}, resp. a^h_t of the channel's head h)."""
    n = len(X)
    if isinstance(model, LinearSSM):
        return [np.repeat(M[None], n, 0) for M in lti(model)]
    if isinstance(model, ElmanRNN):
        W, U, C = params(model, "W", "U", "C")
        D = [np.diag(ref.tanh_secant(z)) for z in ref.rnn_pre_activations(W, U, X)]
        return np.array([Di @ W for Di in D]), np.array([Di @ U for Di in D]), np.repeat(C[None], n, 0)
    if isinstance(model, SelectiveSSM):
        A, delta, Bt, Ct = ref.selective_parts(*selective(model), X)
        decay = np.exp(delta[:, :, None] * A[None])
        return ref.channel_factors(decay, delta[:, :, None] * Bt[:, None, :], Ct, np.eye(model.d))
    P = ssd(model)
    delta, a, Bt, Ct = ref.ssd_parts(*P[:5], X)
    head = np.arange(model.d) // (model.d // model.H)  # the head of each channel
    decay = np.repeat(a[:, head][:, :, None], model.N, 2)
    return ref.channel_factors(decay, delta[:, head][:, :, None] * Bt[:, None, :], Ct, P[5])


STRUCTURED = {
    "LinearSSM": lambda: LinearSSM.random(3, 2, 3, spectral_radius=0.9, seed=4),
    "ElmanRNN": lambda: ElmanRNN.random(3, 2, 3, spectral_radius=1.2, seed=4),
    "SelectiveSSM": lambda: SelectiveSSM.random(2, 3, step_range=(0.1, 1.0), seed=4),
    "SSD": lambda: SSD.random(4, 3, N=2, heads=2, step_range=(0.1, 1.0), seed=4),
}


@pytest.mark.parametrize("name", STRUCTURED)
def test_prop_structured_dynamics_lib_operators_are_the_product_formula_of_their_factors(name):
    # lib's operators and forward passes against C_i A_i ⋯ A_{j+1} B_j and the recurrence, with the
    # factors (A_i, B_i, C_i) evaluated at X in numpy.
    model = STRUCTURED[name]()
    for family, X in ref.input_families(7, model.d, np.random.default_rng(1)).items():
        Y, W = call(model, X)
        for x, y, w in zip(X, Y, W):
            factors = structured_factors(model, x)
            assert ref.itemwise_error(w, ref.structured_operator(*factors), 2) <= 1e-10, family
            assert ref.itemwise_error(y, ref.structured_recurrence(*factors, x), 1) <= 1e-10, family


# -- S4D's and S5's layers: DiagonalSSM and SharedStateSSM -----------------------------------------


def diagonal_np(layer, X):
    """S4D by hand: per channel and mode, s ← μ s + x, y = 2 Re Σ_m C_m B̄_m s_m (Re for real modes) + D x."""
    log_dt, A_log, C, D = params(layer, "log_dt", "A_log", "C", "D")
    lam = -np.exp(A_log).astype(complex)
    if layer.complex:
        lam, C = lam + 1j * params(layer, "A_imag")[0], C @ np.array([1.0, 1j])
    step = np.exp(log_dt)[:, None]
    mu, B = np.exp(step * lam), (np.exp(step * lam) - 1) / lam
    factor = 2.0 if layer.complex else 1.0
    b, n, d = X.shape
    s, Y = np.zeros((b, d, lam.shape[1]), dtype=complex), np.zeros((b, n, d))
    for i in range(n):
        s = mu * s + B * X[:, i, :, None]
        Y[:, i] = factor * (C * s).sum(-1).real + D * X[:, i]
    return Y


def shared_np(layer, X):
    """S5 by hand: s ← μ ⊙ s + B̄ x, y = 2 Re(C s) + D x, complex state."""
    log_dt, A_log, A_imag, B, C, D = params(layer, "log_dt", "A_log", "A_imag", "B", "C", "D")
    lam = -np.exp(A_log) + 1j * A_imag
    mu, B_bar = np.exp(np.exp(log_dt) * lam), ((np.exp(np.exp(log_dt) * lam) - 1) / lam)[:, None] * (B @ [1, 1j])
    b, n, d = X.shape
    s, Y = np.zeros((b, len(lam)), dtype=complex), np.zeros((b, n, d))
    for i in range(n):
        s = mu * s + X[:, i] @ B_bar.T
        Y[:, i] = 2 * (s @ (C @ [1, 1j]).T).real + D * X[:, i]
    return Y


LAYERS = {  # built from the conftest's random_diagonal, random_shared
    "S4D-Lin init": lambda diagonal, shared: DiagonalSSM.random(3, 4, seed=1),
    "S4D-Real init": lambda diagonal, shared: DiagonalSSM.random(3, 3, init="real", seed=2),
    "diagonal random": lambda diagonal, shared: diagonal(3, 2, seed=3),
    "diagonal random real": lambda diagonal, shared: diagonal(2, 3, complex_modes=False, seed=4),
    "S5 init": lambda diagonal, shared: SharedStateSSM.random(3, 4, seed=5),
    "shared random": lambda diagonal, shared: shared(3, 3, seed=6),
}


@pytest.mark.parametrize("case", LAYERS)
def test_diagonal_layers_match_numpy_their_lags_and_their_modes(case, random_diagonal, random_shared):
    layer = LAYERS[case](random_diagonal, random_shared)
    X = np.random.default_rng(0).standard_normal((3, 20, layer.d))
    expected = (shared_np if isinstance(layer, SharedStateSSM) else diagonal_np)(layer, X)
    with torch.no_grad():
        for method in ("recurrence", "convolution", "auto"):
            assert relative_error(layer(t(X), method=method), expected) < 1e-13, method
        L = layer.lags(20).numpy()
        nodes, residues = (z.numpy() for z in layer.modes())
    by_lags = np.stack([sum(X[:, i - ell] @ L[ell].T for ell in range(i + 1)) for i in range(20)], 1)
    assert relative_error(by_lags, expected) < 1e-13
    np.testing.assert_allclose(ref.apply(call(layer, X[0])[1], X[0]), expected[0], atol=1e-12)
    # L_ℓ = Σ_k ν_k^ℓ R_k (0⁰ = 1), real.
    from_modes = np.einsum("kl,kpd->lpd", nodes[:, None] ** np.arange(20), residues)
    np.testing.assert_allclose(from_modes.real, L, atol=1e-13)
    assert np.abs(from_modes.imag).max() < 1e-13
    if isinstance(layer, DiagonalSSM):  # lags are diagonal; the kernel is their diagonal without D
        diagonal = np.einsum("lqq->lq", L)
        assert np.abs(L - np.einsum("lq,qp->lqp", diagonal, np.eye(layer.d))).max() == 0
        kernel = layer.kernel(20).numpy(force=True)
        np.testing.assert_allclose(kernel[:, 1:], diagonal.T[:, 1:], atol=1e-15)
        np.testing.assert_allclose(kernel[:, 0] + params(layer, "D")[0], diagonal[0], atol=1e-15)


def test_diagonal_layers_train_in_float32():
    layer = DiagonalSSM.random(4, 4, seed=0, dtype=torch.float32)
    loss = layer(torch.randn(8, 16, 4)).square().mean()
    assert loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("call_,error,match", [
    (lambda: DiagonalSSM.random(3, 5), ValueError, "N must be even for init='lin'"),
    (lambda: DiagonalSSM.random(3, 4, init="diag"), ValueError, "init must be one of 'lin', 'real'; got 'diag'"),
    (lambda: DiagonalSSM.random(3, 4, step_range=(0.1, 0.01)), ValueError, r"step_range\[1\] must be finite"),
    (lambda: DiagonalSSM.random(3, 4, step_range=0.1), TypeError, "step_range must be a pair"),
    (lambda: SharedStateSSM.random(3, 5), ValueError, "N must be even"),
    (lambda: DiagonalSSM(np.zeros(3), np.zeros((3, 2)), np.zeros((3, 2)), np.zeros(2)), ValueError,
     r"D must have shape \(d,\) = \(3,\)"),
    (lambda: DiagonalSSM(np.zeros(3), np.zeros((3, 2)), np.zeros((3, 2)), np.zeros(3), np.zeros((3, 2))),
     ValueError, r"C must have shape \(d, M, 2\)"),
    (lambda: DiagonalSSM(np.zeros(3), np.zeros((3, 2)), np.zeros((3, 2, 2)), np.zeros(3)),
     ValueError, r"C must have shape \(d, M\)"),
    (lambda: SharedStateSSM(np.zeros(2), np.zeros(2), np.zeros(2), np.zeros((2, 3, 2)), np.zeros((3, 2, 2)),
                            np.zeros(4)), ValueError, r"D must have shape \(d,\) = \(3,\)"),
    (lambda: SharedStateSSM.random(3, 4, seed=5)(torch.zeros(4, 3, dtype=F64), method="scan"), ValueError,
     "method must be one of 'auto', 'recurrence', 'convolution'"),
    (lambda: DiagonalSSM.random(3, 4, seed=1).kernel(0), ValueError, "n must be >= 1"),
    (lambda: DiagonalSSM.random(3, 4, seed=1).lags(-1), ValueError, "n must be >= 1"),
    (lambda: SharedStateSSM.random(3, 4, seed=5).lags(1.5), TypeError, "n must be an integer"),
])
def test_diagonal_layer_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()


# -- S4D-style LTI SSMs --------------------------------------------------------------------------


@pytest.mark.parametrize("init", ["lin", "real"])
@pytest.mark.parametrize("N", [1, 4, 7])
def test_s4d_ssm_has_the_requested_spectral_radius_and_modes(init, N):
    rho = 0.9
    ssm = s4d_ssm(N, 3, rho, init=init, seed=0)
    eig = np.linalg.eigvals(lti(ssm)[0])
    assert (ssm.N, ssm.d, ssm.p) == (N, 3, 3)
    assert np.abs(eig).max() == pytest.approx(rho, rel=1e-12)
    if init == "lin":  # every mode −½ + iπm maps to modulus e^{−Δ/2} = ρ
        np.testing.assert_allclose(np.abs(eig), rho, rtol=1e-12)
        m = np.r_[np.arange(1, N // 2 + 1), -np.arange(1, N // 2 + 1), [0] * (N % 2)]
        expected = np.sort(np.abs(np.angle(np.exp(-2 * np.log(rho) * (-0.5 + 1j * np.pi * m)))))
        np.testing.assert_allclose(np.sort(np.abs(np.angle(eig))), expected, atol=1e-12)
    else:
        np.testing.assert_allclose(np.sort(eig.real), np.sort(rho ** np.arange(1, N + 1)), rtol=1e-12)
    assert s4d_ssm(4, 2, 0.5, p=3).p == 3


@pytest.mark.parametrize("init", ["lin", "real"])
def test_s4d_continuous_is_the_system_behind_s4d_ssm(init):
    A_c, B_c, C = s4d_continuous(5, 3, init=init, p=2, seed=4)
    assert A_c.shape == (5, 5) and B_c.shape == (5, 3) and C.shape == (2, 5)
    rng = np.random.default_rng(4)  # B_c, C drawn from default_rng(seed)
    np.testing.assert_array_equal(B_c, rng.standard_normal((5, 3)) / np.sqrt(3))
    np.testing.assert_array_equal(C, rng.standard_normal((2, 5)) / np.sqrt(5))
    step = s4d_step(0.9, init)
    assert step == pytest.approx(-(2 if init == "lin" else 1) * np.log(0.9), rel=1e-15)
    direct = s4d_ssm(5, 3, 0.9, init=init, p=2, seed=4)
    lam, V = np.linalg.eig(A_c)  # A_c is normal: e^{ΔA_c} by its eigendecomposition, in numpy
    A = (V @ np.diag(np.exp(step * lam)) @ np.linalg.inv(V)).real
    np.testing.assert_allclose(lti(direct)[0], A, atol=1e-14)
    np.testing.assert_allclose(lti(direct)[1], np.linalg.solve(A_c, (A - np.eye(5)) @ B_c), atol=1e-13)  # A_c invertible
    np.testing.assert_array_equal(lti(direct)[2], C)


def test_s4d_continuous_has_the_documented_modes():
    # Blocks [[−½, −πm], [πm, −½]], m = 1..⌊N/2⌋, then −½ (lin); diag(−1, …, −N) (real).
    A_lin = s4d_continuous(5, 1)[0]
    np.testing.assert_allclose(A_lin[:2, :2], [[-0.5, -np.pi], [np.pi, -0.5]])
    np.testing.assert_allclose(A_lin[2:4, 2:4], [[-0.5, -2 * np.pi], [2 * np.pi, -0.5]])
    assert A_lin[4, 4] == -0.5 and np.count_nonzero(A_lin) == 9
    np.testing.assert_array_equal(s4d_continuous(3, 1, init="real")[0], np.diag([-1.0, -2.0, -3.0]))


@pytest.mark.parametrize("call_,error,match", [
    (lambda: s4d_step(1.5), ValueError, r"spectral_radius must be finite and in \(0, 1\)"),
    (lambda: s4d_step(0.0), ValueError, "spectral_radius must be finite and in"),
    (lambda: s4d_step(0.5, "diag"), ValueError, "init must be one of"),
    (lambda: s4d_ssm(4, 2, 1.0), ValueError, "spectral_radius must be finite and in"),
    (lambda: s4d_ssm(4, 2, "0.9"), TypeError, "spectral_radius must be a real number"),
    (lambda: s4d_ssm(4, 2, 0.9, init="diag"), ValueError, "init must be one of"),
    (lambda: s4d_ssm(4, 2, 0.9, dtype="float32"), TypeError, "dtype must be torch.float32 or torch.float64"),
    (lambda: s4d_continuous(4, 2, init=None), ValueError, "init must be one of"),
    (lambda: s4d_ssm(0, 2, 0.9), ValueError, "N must be >= 1"),
    (lambda: s4d_continuous(3, 0), ValueError, "d must be >= 1"),
    (lambda: s4d_continuous(3, 2, p=0), ValueError, "p must be >= 1"),
    (lambda: s4d_continuous(3.0, 2), TypeError, "N must be an integer"),
])
def test_s4d_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()
