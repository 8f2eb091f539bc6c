"""LinearSSM, discretisation, SelectiveSSM and SSD against independent routes (lib.ssm).

The references are plain numpy (tests/reference_operators.py, which imports nothing from lib):
the chapter's formulas transcribed with loops, a convolution with lags formed by repeated
multiplication, Runge–Kutta integration of the continuous system, explicit inverses.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference_operators as ref
from lib import SSD, ElmanRNN, LinearSSM, SelectiveSSM, interaction_rank, relative_error

FAST = settings(max_examples=15, deadline=None)
mpow = np.linalg.matrix_power


def assert_matches_reference(model, n, seed, scale=30.0):
    """lib's operator and forward pass against the page's formulas on every input family."""
    families = ref.input_families(n, model.d, np.random.default_rng(seed), scale=scale)
    ratio, errors = ref.worst_ratio(model, families)
    assert ratio <= 1, errors


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


@pytest.mark.parametrize("N,d,p", [(1, 1, 1), (3, 2, 4), (4, 3, 2)])
def test_prop_lti_ssm_matches_the_reference_on_adversarial_inputs(N, d, p):
    assert_matches_reference(LinearSSM.random(N, d, p, spectral_radius=0.95, seed=N + d), 9, seed=p)


def test_prop_lti_ssm_lags_are_C_A_pow_l_B():
    model = LinearSSM.random(5, 3, 2, spectral_radius=0.97, seed=4)
    A, B, C = model.A, model.B, model.C
    L = model.lags(300)
    assert L.shape == (300, 2, 3)
    for ell in [0, 1, 2, 7, 64, 129, 299]:
        np.testing.assert_allclose(L[ell], C @ mpow(A, ell) @ B, rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(model.lags(1)[0], C @ B, rtol=1e-14)


def test_prop_lti_ssm_operator_does_not_depend_on_the_input():
    model = LinearSSM.random(3, 2, 2, seed=0)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(model.operator(rng.standard_normal((6, 2))), model.operator(rng.standard_normal((6, 2))))


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
    k = ref.numerical_rank(ref.lti_lags(model.A, model.B, model.C, n))
    assert interaction_rank(model, X) == k <= min(model.N, n, model.p * model.d)


def test_prop_lti_ssm_rank_examples_have_the_k_worked_out_by_hand():
    # The cases above whose k is known without computing: nilpotent A gives k = min(n, 2), C = 0 gives 0.
    nilpotent = nilpotent_ssm()
    assert [interaction_rank(nilpotent, np.ones((n, 2))) for n in (1, 2, 6)] == [1, 2, 2]
    assert interaction_rank(LinearSSM(np.eye(3), np.ones((3, 2)), np.zeros((2, 3))), np.ones((4, 2))) == 0
    assert interaction_rank(LinearSSM.damped_rotation(0.9, 0.3), np.ones((5, 2))) == 2


@pytest.mark.parametrize("method", ["recurrence", "scan", "auto"])
@pytest.mark.parametrize("N,d,p,n,b", [(1, 1, 1, 1, 1), (1, 2, 3, 5, 2), (4, 3, 2, 1, 3), (3, 2, 2, 64, 1),
                                       (5, 2, 3, 130, 2), (8, 3, 1, 1000, 1)])
def test_lti_forward_routes_agree_with_the_convolution_by_lags(method, N, d, p, n, b):
    # Independent route: y_i = Σ_ℓ L_ℓ x_{i−ℓ} with L_ℓ = C A^ℓ B by repeated multiplication (numpy).
    model = LinearSSM.random(N, d, p, spectral_radius=0.99, seed=n)
    X = np.random.default_rng(N).standard_normal((b, n, d))
    expected = np.stack([ref.lti_convolution(model.A, model.B, model.C, x) for x in X])
    assert relative_error(model(X, method=method), expected) <= 1e-12
    assert relative_error(model(X[0], method=method), expected[0]) <= 1e-12


@pytest.mark.parametrize("method", ["recurrence", "scan"])
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
def test_prop_discretisation_zoh_is_the_flow_of_the_ode_also_for_singular_A_c(kind, A_c, B_c, C, step):
    # Ā and B̄ = Δ φ₁(ΔA_c) B_c against Runge–Kutta integration of ṡ = A_c s + B_c x over one step.
    model = LinearSSM.from_continuous(A_c, B_c, C, step, method="zoh")
    A_bar, B_bar = ref.rk4_flow(A_c, B_c, step)
    assert ref.column_error(model.A, A_bar) <= 1e-12
    assert ref.column_error(model.B, B_bar) <= 1e-12
    np.testing.assert_array_equal(model.C, C)


@pytest.mark.parametrize("kind,A_c,B_c,C", SYSTEMS[:3], ids=[s[0] for s in SYSTEMS[:3]])
def test_prop_discretisation_zoh_outputs_are_the_samples_under_held_inputs(kind, A_c, B_c, C):
    # y_i = C s(iΔ) when x(t) = x_i on ((i−1)Δ, iΔ] and s(0) = 0 (RK4 through the whole sequence).
    step = 0.3
    X = np.random.default_rng(1).standard_normal((9, 2))
    model = LinearSSM.from_continuous(A_c, B_c, C, step, method="zoh")
    samples = ref.held_input_samples(A_c, B_c, C, step, X)
    assert ref.itemwise_error(model(X), samples, 1) <= 1e-10


def test_prop_discretisation_zoh_closed_forms():
    # Scalar: B̄ = (e^{aΔ} − 1)/a · b, the A_c⁻¹ form; nilpotent N: B̄ = (ΔI + Δ²/2 N) B_c exactly;
    # A_c = 0: B̄ = Δ B_c, where the A_c⁻¹ form is undefined.
    a, b, step = -0.7, 1.3, 0.25
    scalar = LinearSSM.from_continuous([[a]], [[b]], [[2.0]], step, method="zoh")
    assert scalar.A[0, 0] == pytest.approx(np.exp(a * step), rel=1e-14)
    assert scalar.B[0, 0] == pytest.approx((np.exp(a * step) - 1) / a * b, rel=1e-13)
    nilpotent, B_c = np.array([[0.0, 1.0], [0.0, 0.0]]), np.array([[1.0], [2.0]])
    model = LinearSSM.from_continuous(nilpotent, B_c, np.eye(2), 0.4, method="zoh")
    np.testing.assert_allclose(model.A, np.eye(2) + 0.4 * nilpotent, atol=1e-15)
    np.testing.assert_allclose(model.B, (0.4 * np.eye(2) + 0.4**2 / 2 * nilpotent) @ B_c, atol=1e-15)
    zero = LinearSSM.from_continuous(np.zeros((2, 2)), B_c, np.eye(2), 0.4, method="zoh")
    np.testing.assert_allclose(zero.B, 0.4 * B_c, atol=1e-15)


def test_prop_discretisation_zoh_matches_the_inverse_form_when_A_c_is_invertible():
    rng = np.random.default_rng(1)
    A_c, B_c, step = rng.standard_normal((3, 3)), rng.standard_normal((3, 2)), 0.3
    model = LinearSSM.from_continuous(A_c, B_c, np.eye(3), step, method="zoh")
    lam, V = np.linalg.eig(A_c)
    Vinv = np.linalg.inv(V)
    A = (V @ np.diag(np.exp(step * lam)) @ Vinv).real
    B = (V @ np.diag((np.exp(step * lam) - 1) / lam) @ Vinv @ B_c).real  # A_c⁻¹(e^{ΔA_c} − I) B_c
    np.testing.assert_allclose(model.A, A, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(model.B, B, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("kind,A_c,B_c,C", SYSTEMS, ids=[s[0] for s in SYSTEMS])
@pytest.mark.parametrize("step", STEPS)
def test_prop_discretisation_bilinear_matches_the_explicit_inverse(kind, A_c, B_c, C, step):
    model = LinearSSM.from_continuous(A_c, B_c, C, step, method="bilinear")
    A_bar, B_bar = ref.bilinear(A_c, B_c, step)
    assert ref.column_error(model.A, A_bar) <= 1e-12
    assert ref.column_error(model.B, B_bar) <= 1e-12
    np.testing.assert_array_equal(model.C, C)


@pytest.mark.parametrize("kind,A_c,B_c,C", SYSTEMS, ids=[s[0] for s in SYSTEMS])
@pytest.mark.parametrize("method", ["bilinear", "zoh"])
def test_prop_discretisation_maps_eigenvalues_and_keeps_Hurwitz_systems_stable(kind, A_c, B_c, C, method):
    for step in STEPS:
        model = LinearSSM.from_continuous(A_c, B_c, C, step, method=method)
        mapped = ref.mapped_spectral_radius(A_c, step, method)
        assert model.spectral_radius == pytest.approx(mapped, rel=1e-10)
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
    with pytest.raises(ValueError, match=r"A_c has the eigenvalue 2/step = .*I - step/2 A_c is singular"):
        LinearSSM.from_continuous(A_c, np.ones((N, 1)), np.ones((1, N)), step, method="bilinear")
    # The zero-order hold is defined for the same system.
    LinearSSM.from_continuous(A_c, np.ones((N, 1)), np.ones((1, N)), step, method="zoh")


def test_discretisation_validates_arguments():
    with pytest.raises(ValueError, match="step must be > 0"):
        LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), 0.0)
    with pytest.raises(TypeError, match="step must be a real number"):
        LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), "0.1")
    with pytest.raises(ValueError, match="method must be one of"):
        LinearSSM.from_continuous(np.eye(2), np.eye(2), np.eye(2), 0.1, method="euler")
    with pytest.raises(ValueError, match=r"B_c must have shape \(N, d\) = \(2, 3\)"):
        LinearSSM.from_continuous(np.eye(2), np.eye(3), np.eye(2), 0.1)
    with pytest.raises(ValueError, match=r"A_c must have shape \(N, N\)"):
        LinearSSM.from_continuous(np.ones((2, 3)), np.eye(2), np.eye(2), 0.1)


# -- SelectiveSSM -----------------------------------------------------------


@FAST
@given(n=st.integers(1, 7), d=st.integers(1, 3), N=st.integers(1, 4), seed=st.integers(0, 999))
def test_prop_selective_ssm_operator_is_C_i_A_i_down_to_A_j1_B_j(n, d, N, seed):
    model = SelectiveSSM.random(d, N, step_range=(0.1, 2.0), seed=seed)
    X = np.random.default_rng(seed).standard_normal((n, d))
    W = model.operator(X)
    assert ref.itemwise_error(W, ref.operator(model, X), 2) <= 1e-10
    assert ref.itemwise_error(model(X, method="recurrence"), ref.forward(model, X), 1) <= 1e-10
    assert np.all(W[:, :, ~np.eye(d, dtype=bool)] == 0)  # diagonal in channels
    A, delta, Bt, Ct = ref.selective_parts(model.A_log, model.W_delta, model.b_delta, model.W_B, model.W_C, X)
    sel = model.selection(X)
    for got, expected in zip(sel, (delta, Bt, Ct)):  # entries that cancel are compared to the largest
        np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-13 * np.abs(expected).max())


@pytest.mark.parametrize("d,N,steps", [(1, 1, (0.1, 1.0)), (3, 4, (0.1, 1.0)), (2, 16, (1e-3, 1e-1))])
def test_prop_selective_ssm_matches_the_reference_on_adversarial_inputs(d, N, steps):
    assert_matches_reference(SelectiveSSM.random(d, N, step_range=steps, seed=d + N), 8, seed=N)


def test_prop_selective_ssm_interaction_rank_is_d_under_its_conditions():
    X = np.random.default_rng(0).standard_normal((4, 6, 3))
    model = SelectiveSSM.random(3, 4, step_range=(0.1, 1.0), seed=2)
    assert np.linalg.matrix_rank(model.W_delta) == 3 and ref.quadratic_form_nonzero(model.W_B, model.W_C)
    assert interaction_rank(model, X) == 3
    assert interaction_rank(model, X[:1, :3]) == 3  # d tokens suffice (almost surely)


def test_prop_selective_ssm_interaction_rank_falls_when_its_conditions_fail():
    base = SelectiveSSM.random(3, 4, step_range=(0.1, 1.0), seed=2)
    X = np.random.default_rng(0).standard_normal((4, 6, 3))
    # W_Δ = 0 with equal biases: Δ_t is the same in every channel, and so is A[c] (S4D-real),
    # so every block is a multiple of the identity: rank 1 < d.
    frozen = SelectiveSSM(base.A_log, np.zeros((3, 3)), np.full(3, 0.2), base.W_B, base.W_C)
    assert interaction_rank(frozen, X) == 1
    # q ≡ 0 (W_C = 0): every block vanishes.
    blind = SelectiveSSM(base.A_log, base.W_delta, base.b_delta, base.W_B, np.zeros((4, 3)))
    assert interaction_rank(blind, X) == 0


@pytest.mark.parametrize("n,step_range,b", [(1, (0.1, 1.0), 1), (5, (0.1, 1.0), 2), (2000, (0.5, 5.0), 2),
                                            (2000, (1e-3, 1e-1), 1), (3001, (20.0, 50.0), 1)])
def test_selective_routes_agree_with_the_numpy_reference_and_survive_strong_decay(n, step_range, b):
    model = SelectiveSSM.random(3, 16, step_range=step_range, seed=n)
    X = np.random.default_rng(n).standard_normal((b, n, 3)) * 2
    expected = ref.forward(model, X)
    for method in ("recurrence", "scan", "auto"):
        Y = model(X, method=method)
        assert np.all(np.isfinite(Y))
        assert relative_error(Y, expected) <= 1e-10


def test_selective_operator_is_finite_for_strong_decay():
    model = SelectiveSSM.random(2, 8, step_range=(50.0, 100.0), seed=0)
    X = np.random.default_rng(0).standard_normal((200, 2))
    W = model.operator(X)
    assert np.all(np.isfinite(W))
    # Applied to X, lib's operator gives the numpy reference's forward pass.
    assert relative_error(np.einsum("ijpd,jd->ip", W, X), ref.forward(model, X)) <= 1e-10
    assert ref.itemwise_error(W[:30, :30], ref.operator(model, X[:30]), 2) <= 1e-10


@pytest.mark.parametrize("method", ["recurrence", "scan"])
def test_selective_routes_are_differentiable(method):
    # Autograd through each route against central differences of the numpy reference.
    model = SelectiveSSM.random(2, 4, step_range=(0.05, 1.0), seed=0)
    X = np.random.default_rng(0).standard_normal((12, 2))
    Xt = torch.tensor(X, requires_grad=True)
    (g,) = torch.autograd.grad(model(Xt, method=method)[8].sum(), Xt)
    expected = ref.central_difference_gradient(lambda Z: ref.forward(model, Z)[8].sum(), X)
    np.testing.assert_allclose(g.numpy(), expected, rtol=1e-6, atol=1e-9)
    assert np.all(g.numpy()[9:] == 0)


def test_selective_ssm_validates_its_parameters():
    with pytest.raises(ValueError, match=r"W_delta must have shape \(d, d\) = \(3, 3\)"):
        SelectiveSSM(np.zeros((3, 2)), np.zeros((2, 3)), np.zeros(3), np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(TypeError, match=r"step_range must be a pair"):
        SelectiveSSM.random(3, 2, step_range=0.1)
    with pytest.raises(ValueError, match=r"step_range\[0\] must be > 0"):
        SelectiveSSM.random(3, 2, step_range=(0.0, 1.0))


# -- SSD --------------------------------------------------------------------


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
    for method in ("recurrence", "scan"):
        assert ref.itemwise_error(model(X, method=method), ref.forward(model, X), 1) <= 1e-10
    W_O = params[5]
    V = np.zeros((H, p, d))
    for k in range(H):
        V[k][:, k * dh:(k + 1) * dh] = W_O[:, k * dh:(k + 1) * dh]  # W_O P_h
    np.testing.assert_array_equal(model.values(), V)
    assert ref.itemwise_error(model.operator(X), ref.operator(model, X), 2) <= 1e-10
    for name, value in zip(("A_log", "W_delta", "b_delta", "W_B", "W_C", "W_O"), params):
        np.testing.assert_array_equal(getattr(model, name), value)


@pytest.mark.parametrize("H,dh,p", [(1, 1, 1), (2, 2, 3), (3, 1, 2)])
def test_prop_ssd_matches_the_reference_on_adversarial_inputs(H, dh, p):
    model = SSD.random(H * dh, p, N=3, heads=H, step_range=(0.1, 1.0), seed=H + p)
    assert_matches_reference(model, 8, seed=H)


def test_prop_ssd_single_head_interaction_rank_is_one():
    model = SSD.random(4, 3, N=5, heads=1, step_range=(0.1, 1.0), seed=0)
    X = np.random.default_rng(0).standard_normal((3, 10, 4))
    assert interaction_rank(model, X) == 1


def test_prop_ssd_interaction_rank_is_H_under_its_conditions():
    X = np.random.default_rng(1).standard_normal((3, 10, 6))
    for H in (1, 2, 3, 6):
        model = SSD.random(6, 6, N=4, heads=H, step_range=(0.1, 1.0), seed=H)
        assert np.linalg.matrix_rank(model.W_delta) == H and ref.quadratic_form_nonzero(model.W_B, model.W_C)
        assert interaction_rank(model, X) == H == ref.coefficient_rank(model, X)
        assert interaction_rank(model, X[:1, :H]) == H  # H tokens suffice (almost surely)


def test_prop_ssd_interaction_rank_falls_when_its_conditions_fail():
    A_log, W_delta, b_delta, W_B, W_C, W_O = ssd_parameters(6, 4, 3, 3, 0)
    X = np.random.default_rng(2).standard_normal((3, 8, 6))
    dead = W_O.copy()
    dead[:, 2:4] = 0  # W_O P_2 = 0: head 2 contributes nothing
    assert interaction_rank(SSD(A_log, W_delta, b_delta, W_B, W_C, dead), X) == 2
    assert interaction_rank(SSD(A_log, W_delta, b_delta, W_B, np.zeros_like(W_C), W_O), X) == 0  # q ≡ 0


def test_ssd_rejects_heads_not_dividing_d():
    with pytest.raises(ValueError, match=r"A_log must have shape \(H,\) with H dividing d"):
        SSD(*ssd_parameters(5, 2, 3, 2, 0))


# -- prop-structured-dynamics -------------------------------------------------------------


@pytest.mark.parametrize("N,d,p", [(1, 1, 1), (3, 2, 4), (4, 3, 2)])
def test_prop_structured_dynamics_product_formula_equals_the_recurrence_for_arbitrary_factors(N, d, p):
    # Independent routes in numpy: the operator by impulses through the recurrence (linear in X
    # once the factors are fixed), and the product formula C_i A_i ⋯ A_{j+1} B_j.
    As, Bs, Cs = ref.adversarial_factors(8, N, d, p, np.random.default_rng(N + d))
    product = ref.structured_operator(As, Bs, Cs)
    assert ref.itemwise_error(product, ref.impulse_operator(As, Bs, Cs), 2) <= 1e-12
    assert np.all(product[np.triu_indices(8, 1)] == 0)  # causal
    X = np.random.default_rng(0).standard_normal((8, d))
    assert ref.itemwise_error(ref.apply(product, X), ref.structured_recurrence(As, Bs, Cs, X), 1) <= 1e-12


STRUCTURED = {
    "LinearSSM": lambda: LinearSSM.random(3, 2, 3, spectral_radius=0.9, seed=4),
    "ElmanRNN": lambda: ElmanRNN.random(3, 2, 3, spectral_radius=1.2, seed=4),
    "SelectiveSSM": lambda: SelectiveSSM.random(2, 3, step_range=(0.1, 1.0), seed=4),
    "SSD": lambda: SSD.random(4, 3, N=2, heads=2, step_range=(0.1, 1.0), seed=4),
}


@pytest.mark.parametrize("name", STRUCTURED)
def test_prop_structured_dynamics_lib_operators_are_the_product_formula_of_their_factors(name):
    # lib's operators and forward passes against C_i A_i ⋯ A_{j+1} B_j and the recurrence, with the
    # factors (A_i, B_i, C_i) the chapter identifies, evaluated at X in numpy.
    model = STRUCTURED[name]()
    for family, X in ref.input_families(7, model.d, np.random.default_rng(1)).items():
        for x in X:
            factors = ref.structured_factors(model, x)
            tol = ref.tolerance(family)
            assert ref.itemwise_error(model.operator(x), ref.structured_operator(*factors), 2) <= tol, family
            assert ref.itemwise_error(model(x), ref.structured_recurrence(*factors, x), 1) <= tol, family
