"""The training loop `fit` and students trained to imitate an LTI teacher (`imitate`), lib.training.

Independent routes: least squares and hand-written optimiser steps for `fit`; for `imitate`, a
plain Adam loop on the students' own forward passes, students trained one at a time, the
closed-form optimum `optimal_head_errors`, and errors recomputed here with numpy from the
lags and from the documented held-out batch.
"""

import warnings

import numpy as np
import pytest
import torch

import reference
from lib import Dense, LinearSSM, RelativeHeads, SoftmaxAttention, fit, imitate, min_heads, optimal_head_errors

N_SEQ, D = 8, 2
TEACHER = LinearSSM.random(3, D, D, spectral_radius=0.8, seed=1)   # k = 3 on length 8
HELD_OUT_SEED = 20251217                                           # documented in lib.training



def heads(H, seed=0, n=N_SEQ, d=D, p=D):
    """The book's RelativeHeads student (the old FactorizedStudent)."""
    return RelativeHeads.random(H, n, d, p, decay=1.0, scale=0.1, seed=seed)


def softmax(H, seed=0, n=N_SEQ):
    """The book's softmax student: full-width heads, zero position scores (the old SoftmaxStudent)."""
    return SoftmaxAttention.random(D, D, H, d_k=D, d_v=D, max_length=n, seed=seed)


def teacher_lags(n=N_SEQ):
    A, B, C = (t.numpy(force=True) for t in (TEACHER.A, TEACHER.B, TEACHER.C))
    return reference.lti_lags(A, B, C, n)


def exact_error(student, n=N_SEQ):
    """Σ_ℓ (n − ℓ)‖L_ℓ − L̂_ℓ‖²_F, from the teacher's matrices and the student's parameters."""
    L_hat = np.einsum("hl,hpd->lpd", student.coefficients.numpy(force=True)[:, :n], student.V.numpy(force=True))
    E = teacher_lags(n) - L_hat
    return float(sum((n - ell) * (E[ell] ** 2).sum() for ell in range(n)))


def batch_errors(student, X):
    """Σ_i ‖y_i − ŷ_i‖² per sequence, the teacher's outputs from its numpy operator."""
    A, B, C = (t.numpy(force=True) for t in (TEACHER.A, TEACHER.B, TEACHER.C))
    Y = np.einsum("ijpd,bjd->bip", reference.lti_operator(A, B, C, X.shape[1]), X)
    with torch.no_grad():
        Y_hat = student(torch.from_numpy(X)).numpy()
    return ((Y - Y_hat) ** 2).sum(axis=(1, 2))


def parameters(*models):
    return [p.detach().clone() for m in models for p in m.parameters()]


def test_teacher_has_three_heads():
    assert min_heads(TEACHER, N_SEQ) == 3


# -- imitate ------------------------------------------------------------------------------------


def test_imitate_loss_is_the_batch_error_of_fresh_gaussian_batches():
    # One step at a tiny learning rate: the first loss is mean_b Σ_i ‖y_i − ŷ_i‖² on the first batch
    # drawn from torch.Generator().manual_seed(seed), recomputed here (softmax: by the numpy reference).
    X = torch.randn(5, N_SEQ, D, generator=torch.Generator().manual_seed(7), dtype=torch.float64).numpy()
    student, soft = heads(2, seed=3), softmax(2, seed=3)
    W_Q, W_K, W_V, W_O = (t.numpy(force=True) for t in (soft.W_Q, soft.W_K, soft.W_V, soft.W_O))
    bias = soft.position_bias.numpy(force=True)
    A, B, C = (t.numpy(force=True) for t in (TEACHER.A, TEACHER.B, TEACHER.C))
    soft_expected = np.mean([((reference.lti_forward(A, B, C, x) - reference.softmax_forward(
        W_Q, W_K, W_V, W_O, x, True, bias)) ** 2).sum() for x in X])
    expected = [batch_errors(student, X).mean(), soft_expected]
    results = imitate([student, soft], TEACHER, steps=1, batch=5, lr=1e-12, final_lr=1e-12, seed=7)
    for (error, history), value in zip(results, expected):
        assert history.shape == (1,) and history.dtype == np.float64
        assert history[0] == pytest.approx(value, rel=1e-12)


def test_imitate_is_deterministic_and_keeps_the_students_order():
    def run(seed):
        return imitate([softmax(1, seed=0), heads(2, seed=0)], TEACHER, steps=20, batch=8, seed=seed)

    first, second, other = run(4), run(4), run(5)
    for a, b in zip(first, second):
        assert a[0] == b[0]
        np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(first[1][1], other[1][1])
    # Order: the softmax student's result first, as it was given.
    alone = imitate([softmax(1, seed=0)], TEACHER, steps=20, batch=8, seed=4)[0]
    assert alone[0] == first[0][0]


def test_imitate_relative_heads_trained_together_equal_each_trained_alone():
    students = [heads(H, seed=H) for H in (1, 3)]
    together = imitate(students, TEACHER, steps=100, seed=2)
    for H, student, (error, history) in zip((1, 3), students, together):
        alone_student = heads(H, seed=H)
        alone_error, alone_history = imitate([alone_student], TEACHER, steps=100, seed=2)[0]
        np.testing.assert_allclose(history, alone_history, rtol=1e-9)
        assert error == pytest.approx(alone_error, rel=1e-8)
        torch.testing.assert_close(student.V, alone_student.V, rtol=1e-8, atol=1e-12)
        torch.testing.assert_close(student.coefficients, alone_student.coefficients, rtol=1e-8, atol=1e-12)


def test_imitate_matches_a_plain_training_loop():
    # The window-Gram loss of the RelativeHeads population against the plain route: the student's own
    # forward pass and the teacher's recurrence on each batch, the same batches (same generator), Adam and
    # the same learning-rate schedule.  Forty steps follow the same trajectory.
    steps, batch, lr, final_lr = 40, 8, 0.05, 1e-3
    fast = heads(2, seed=5)
    result = imitate([fast], TEACHER, steps=steps, batch=batch, lr=lr, final_lr=final_lr, seed=9)[0]
    plain = heads(2, seed=5)
    optimizer = torch.optim.Adam(plain.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=(final_lr / lr) ** (1 / (steps - 1)))
    generator = torch.Generator().manual_seed(9)
    history = []
    for _ in range(steps):
        X = torch.randn(batch, N_SEQ, D, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            Y = TEACHER(X, method="recurrence")
        loss = ((plain(X) - Y) ** 2).sum((1, 2)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        history.append(loss.item())
    np.testing.assert_allclose(result[1], history, rtol=1e-9)
    torch.testing.assert_close(fast.V, plain.V, rtol=1e-8, atol=1e-12)


def test_imitate_students_reach_the_closed_form_optimum():
    # H >= k: near-exact.  H < k: never below the optimum (thm-approx-head-count), and close to it.
    # Each reported error is the exact population error, recomputed here from the parameters.
    students = [heads(H, seed=H) for H in (1, 2, 3, 4)]
    results = imitate(students, TEACHER, steps=1500, seed=0)
    optimum = optimal_head_errors(TEACHER, N_SEQ, 4)
    for student, (error, history) in zip(students, results):
        assert error == pytest.approx(exact_error(student), rel=1e-10)
        assert history.shape == (1500,)
        if student.H >= 3:
            assert error <= 1e-6 * optimum[0]
        else:
            assert error >= optimum[student.H] * (1 - 1e-9)
            assert error <= 1.05 * optimum[student.H]


def test_imitate_relative_heads_error_is_the_sampled_error():
    # The reported (exact) error against the mean over 8192 Gaussian sequences: within 4 standard errors.
    student = heads(2, seed=1)
    error = imitate([student], TEACHER, steps=5, seed=0)[0][0]
    X = np.random.default_rng(0).standard_normal((8192, N_SEQ, D))
    sampled = batch_errors(student, X)
    assert abs(error - sampled.mean()) < 4 * sampled.std() / np.sqrt(len(sampled))


def test_imitate_softmax_student_with_position_scores_trains_and_is_scored_on_the_held_out_batch():
    student = softmax(2, seed=0)
    assert student.H == 2 and student.max_length == N_SEQ
    assert torch.equal(student.position_bias, torch.zeros(2, N_SEQ, dtype=torch.float64))  # uniform at first
    X = torch.randn(512, N_SEQ, D, generator=torch.Generator().manual_seed(HELD_OUT_SEED),
                    dtype=torch.float64).numpy()
    before = batch_errors(student, X).mean()
    lines = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # progress reports read the losses without warnings
        error, history = imitate([student], TEACHER, steps=100, batch=16, seed=0, held_out=512,
                                 progress=lines.append)[0]
    assert len(lines) == 10 and "step 100/100" in lines[-1] and history.shape == (100,)
    assert error == pytest.approx(batch_errors(student, X).mean(), rel=1e-12)  # the documented batch
    assert error < before
    assert torch.abs(student.position_bias).max() > 0  # the scores trained


@pytest.mark.parametrize("call, error, match", [
    (lambda s: imitate([s], np.eye(2), steps=1), TypeError, "teacher must be an LTI model"),
    (lambda s: imitate([s], SoftmaxAttention.random(2, 2), steps=1), TypeError, "teacher must be an LTI model"),
    (lambda s: imitate([heads(1, d=3)], TEACHER, steps=1), ValueError, "students must have d = 2, p = 2"),
    (lambda s: imitate([heads(1, p=3)], TEACHER, steps=1), ValueError, "students must have d = 2, p = 2"),
    (lambda s: imitate([Dense.random(2, 2)], TEACHER, steps=1), TypeError, "students must be RelativeHeads"),
    (lambda s: imitate([SoftmaxAttention.random(2, 2)], TEACHER, steps=1), TypeError,
     "students must be RelativeHeads or SoftmaxAttention with position scores"),
    (lambda s: imitate([], TEACHER), TypeError, "students must be"),
    (lambda s: imitate(s, TEACHER, steps=1), TypeError, "students must be a sequence"),
    (lambda s: imitate(None, TEACHER, steps=1), TypeError, "students must be a sequence"),
    (lambda s: imitate([heads(1, n=4), heads(1, n=5)], TEACHER, steps=1), ValueError,
     "RelativeHeads students must share one length"),
    (lambda s: imitate([s], TEACHER, steps=0), ValueError, "steps must be >= 1"),
    (lambda s: imitate([s], TEACHER, steps=2.0), TypeError, "steps must be an integer"),
    (lambda s: imitate([s], TEACHER, batch=1.5), TypeError, "batch must be an integer"),
    (lambda s: imitate([s], TEACHER, batch=0), ValueError, "batch must be >= 1"),
    (lambda s: imitate([s], TEACHER, lr=0.0), ValueError, "lr must be finite and in"),
    (lambda s: imitate([softmax(1)], TEACHER, final_lr=-1.0), ValueError, "final_lr must be finite and in"),
    (lambda s: imitate([s], TEACHER, lr=float("nan")), ValueError, "lr must be finite"),
    (lambda s: imitate([s], TEACHER, progress="print"), TypeError, "progress must be callable"),
    (lambda s: imitate([softmax(1)], TEACHER, seed=-1), ValueError, "seed must be >= 0"),
    (lambda s: imitate([softmax(1)], TEACHER, held_out=0), ValueError, "held_out must be >= 1"),
    (lambda s: imitate([s], TEACHER, device=0), TypeError, "device must be a str or torch.device"),
    (lambda s: imitate([s], TEACHER, device="nonsense"), ValueError, "device must be 'cpu' or an accelerator"),
])
def test_imitate_bad_inputs_name_the_argument_and_train_nothing(call, error, match):
    student = heads(1)
    before = parameters(student)
    with pytest.raises(error, match=match):
        call(student)
    assert all(torch.equal(a, b) for a, b in zip(before, parameters(student)))


# -- devices: only the CPU is exercised (no GPU here); others are refused before anything trains ----

UNAVAILABLE = [name for name, available in (("cuda", torch.cuda.is_available()), ("cuda:0", torch.cuda.is_available()),
                                            ("mps", torch.backends.mps.is_available())) if not available]


@pytest.mark.parametrize("device", ["nonsense", "", "cuda:x", "meta", *UNAVAILABLE])
def test_unknown_or_unavailable_device_is_refused_before_training(device):
    student, soft, dense = heads(1), softmax(1), Dense.random(2, 1)
    before = parameters(student, soft, dense)
    calls = [lambda: imitate([student], TEACHER, steps=1, device=device),
             lambda: imitate([soft], TEACHER, steps=1, device=device),
             lambda: fit(dense, lambda m, X: m(X).sum(), lambda g: iter(lambda: (torch.ones(1, 2),), None),
                         steps=1, lr=0.1, device=device)]
    for call in calls:
        with pytest.raises(ValueError, match="device"):
            call()
    after = [p.detach() for m in (student, soft, dense) for p in m.parameters()]
    assert all(torch.equal(a, b) and b.device.type == "cpu" for a, b in zip(before, after))


# -- fit ----------------------------------------------------------------------------------------


def _regression(seed=0):
    """y = X w*: a model whose least-squares optimum is known in closed form."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(64, 3, generator=g, dtype=torch.float64)
    return X, X @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)


def test_fit_reaches_the_least_squares_solution_deterministically():
    X, y = _regression()

    def batches(generator):
        while True:
            rows = torch.randint(len(X), (16,), generator=generator)
            yield X[rows], y[rows]

    def loss(m, Xb, yb):
        return ((m(Xb)[:, 0] - yb) ** 2).mean()

    model = Dense(np.zeros((1, 3)))
    history = fit(model, loss, batches, steps=400, lr=0.05, final_lr=1e-3)
    assert history.shape == (400,) and history.dtype == np.float64 and history[-1] < 1e-3 * history[0]
    w = np.linalg.lstsq(X.numpy(), y.numpy(), rcond=None)[0]
    np.testing.assert_allclose(model.W.numpy(force=True)[0], w, atol=1e-2)
    assert model.W.device.type == "cpu" and model.W.requires_grad
    again = Dense(np.zeros((1, 3)))
    np.testing.assert_array_equal(history, fit(again, loss, batches, steps=400, lr=0.05, final_lr=1e-3))


def test_fit_sgd_with_constant_rate_is_the_heavy_ball_method():
    # Two SGD steps on f(w) = ½‖w − t‖² by hand: v₁ = g₀, w₁ = w₀ − η v₁; v₂ = 0.9 v₁ + g₁, w₂ = w₁ − η v₂.
    target = np.array([[1.0, 2.0]])
    model = Dense(np.zeros((1, 2)))
    loss = lambda m, _: 0.5 * ((m.W - torch.as_tensor(target)) ** 2).sum()
    history = fit(model, loss, lambda g: iter(lambda: (torch.zeros(1),), None), steps=2, lr=0.1, optimizer="sgd")
    w0 = np.zeros((1, 2))
    v1 = w0 - target
    w1 = w0 - 0.1 * v1
    v2 = 0.9 * v1 + (w1 - target)
    w2 = w1 - 0.1 * v2
    np.testing.assert_allclose(model.W.numpy(force=True), w2, rtol=1e-14)
    np.testing.assert_allclose(history, [0.5 * (target ** 2).sum(), 0.5 * ((w1 - target) ** 2).sum()], rtol=1e-14)


def test_fit_adam_with_a_decaying_rate_is_adam_by_hand():
    # Three Adam steps on f(w) = ½‖w − t‖² (β = 0.9, 0.999, ε = 1e-8), the rate 0.1 → 0.01 geometrically.
    target = np.array([[1.0, -3.0]])
    model = Dense(np.zeros((1, 2)))
    loss = lambda m, _: 0.5 * ((m.W - torch.as_tensor(target)) ** 2).sum()
    fit(model, loss, lambda g: iter(lambda: (torch.zeros(1),), None), steps=3, lr=0.1, final_lr=0.01)
    w, m, v = np.zeros((1, 2)), 0.0, 0.0
    for t, rate in enumerate(0.1 * (0.1 ** (np.arange(3) / 2)), start=1):
        g = w - target
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g ** 2
        w = w - rate * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    np.testing.assert_allclose(model.W.numpy(force=True), w, rtol=1e-12)


def test_fit_reports_many_losses_and_refuses_divergence():
    model = Dense(np.ones((2, 2)))
    losses = lambda m, _: (m.W ** 2).sum(1)             # two independent losses, summed for the step
    history = fit(model, losses, lambda g: iter(lambda: (torch.zeros(1),), None), steps=3, lr=0.1)
    assert history.shape == (3, 2)
    np.testing.assert_allclose(history[0], [2.0, 2.0])
    exploding = lambda m, _: (m.W * float("inf")).sum()
    with pytest.raises(FloatingPointError, match="training diverged at step 0"):
        fit(Dense(np.ones((2, 2))), exploding, lambda g: iter(lambda: (torch.zeros(1),), None), steps=3, lr=0.1)


def _frozen():
    model = Dense.random(2, 2)
    return model.requires_grad_(False)


@pytest.mark.parametrize("call, error, match", [
    (lambda: fit(np.eye(2), lambda m: 0, lambda g: [], steps=1, lr=0.1), TypeError, "model must be a torch.nn.Module"),
    (lambda: fit(torch.nn.ReLU(), lambda m: 0, lambda g: [], steps=1, lr=0.1), ValueError,
     "model must have parameters that require grad"),
    (lambda: fit(_frozen(), lambda m: 0, lambda g: [], steps=1, lr=0.1), ValueError,
     "model must have parameters that require grad"),
    (lambda: fit(Dense.random(2, 2), 3, lambda g: [], steps=1, lr=0.1), TypeError, "loss and batches must be callable"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, [], steps=1, lr=0.1), TypeError, "loss and batches must be callable"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=0, lr=0.1), ValueError, "steps must be >= 1"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=1, lr=-0.1), ValueError, "lr must be finite"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=1, lr="0.1"), TypeError, "lr must be a real"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=1, lr=0.1, final_lr=0.0), ValueError,
     "final_lr must be finite"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=1, lr=0.1, optimizer="rmsprop"),
     ValueError, "optimizer must be one of 'adam', 'sgd'"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=1, lr=0.1, seed=-1), ValueError,
     "seed must be >= 0"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=1, lr=0.1, seed=1.5), TypeError,
     "seed must be an integer"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=1, lr=0.1, progress="print"), TypeError,
     "progress must be callable"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=1, lr=0.1, device=None), TypeError,
     "device must be a str or torch.device"),
])
def test_fit_bad_inputs_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
