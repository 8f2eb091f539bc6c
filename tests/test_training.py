"""Training multi-head students against SSM teachers (lib.training)."""

import numpy as np
import pytest
import torch

from lib import Dense, LinearSSM, RelativeHeads, SoftmaxAttention
from lib.heads import min_heads, optimal_head_errors, population_error
from lib.training import (
    FactorizedStudent,
    check_device,
    fit,
    SoftmaxStudent,
    TrainResult,
    held_out_error,
    train,
    train_factorized,
    train_students,
)

N_SEQ, D = 8, 2
TEACHER = LinearSSM.random(3, D, D, spectral_radius=0.8, seed=1)   # k = 3 on length 8


def test_teacher_has_three_heads():
    assert min_heads(TEACHER, N_SEQ) == 3


def test_factorized_student_is_relative_heads():
    student = FactorizedStudent(2, N_SEQ, D, D, seed=0, init_scale=0.3)
    assert isinstance(student, RelativeHeads) and student.H == 2 and student.max_length == N_SEQ
    rng = np.random.default_rng(0)  # the documented init: V ~ N(0, 1/d), then c ~ N(0, init_scale²)
    np.testing.assert_array_equal(student.V, rng.standard_normal((2, D, D)) / np.sqrt(D))
    np.testing.assert_array_equal(student.coefficients, 0.3 * rng.standard_normal((2, N_SEQ)))
    # Closed-form error: Σ_ℓ (n−ℓ)‖L_ℓ − L̂_ℓ‖²_F, recomputed here from the parameters.
    L = TEACHER.lags(N_SEQ)
    L_hat = np.einsum("hl,hpd->lpd", student.coefficients, student.V)
    expected = sum((N_SEQ - ell) * ((L[ell] - L_hat[ell]) ** 2).sum() for ell in range(N_SEQ))
    assert population_error(TEACHER, student, N_SEQ) == pytest.approx(expected, rel=1e-12)


def test_train_loss_is_the_batch_error_of_fresh_gaussian_batches():
    # One step at a tiny learning rate: the first loss is mean_b Σ_i ‖y_i − ŷ_i‖² on the
    # first batch drawn from torch.Generator().manual_seed(seed), computed directly here.
    for student in (FactorizedStudent(2, N_SEQ, D, D, seed=3), SoftmaxStudent(2, N_SEQ, D, D, seed=3)):
        X = torch.randn(5, N_SEQ, D, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        with torch.no_grad():
            expected = ((student(X) - TEACHER(X)) ** 2).sum((1, 2)).mean().item()
        result = train(student, TEACHER, steps=1, batch=5, lr=1e-12, final_lr=1e-12, seed=7)
        assert result.history.shape == (1,)
        assert result.history[0] == pytest.approx(expected, rel=1e-12)


def test_train_is_deterministic():
    runs = [train(FactorizedStudent(2, N_SEQ, D, D, seed=0), TEACHER, steps=50, seed=4) for _ in range(2)]
    np.testing.assert_array_equal(runs[0].history, runs[1].history)
    assert runs[0].error == runs[1].error
    soft = [train(SoftmaxStudent(1, N_SEQ, D, D, seed=0), TEACHER, steps=20, batch=8, seed=4) for _ in range(2)]
    np.testing.assert_array_equal(soft[0].history, soft[1].history)
    other = train(FactorizedStudent(2, N_SEQ, D, D, seed=0), TEACHER, steps=50, seed=5)
    assert not np.array_equal(runs[0].history, other.history)


def test_train_factorized_equals_separate_runs():
    together = train_factorized([FactorizedStudent(H, N_SEQ, D, D, seed=H) for H in (1, 3)], TEACHER,
                                steps=100, seed=2)
    for H, joint in zip((1, 3), together):
        alone = train(FactorizedStudent(H, N_SEQ, D, D, seed=H), TEACHER, steps=100, seed=2)
        np.testing.assert_allclose(joint.history, alone.history, rtol=1e-9)
        assert joint.error == pytest.approx(alone.error, rel=1e-8)


def test_train_factorized_matches_a_plain_training_loop():
    # The window-Gram loss of train_factorized against the plain route: the student's own forward pass on
    # each batch, the same batches (same generator), Adam and the same learning-rate schedule.  Forty steps
    # follow the same trajectory, so the lagged exact loss and its gradient agree with the direct ones.
    steps, batch, lr, final_lr = 40, 8, 0.05, 1e-3
    fast = FactorizedStudent(2, N_SEQ, D, D, seed=5)
    result = train_factorized([fast], TEACHER, steps=steps, batch=batch, lr=lr, final_lr=final_lr, seed=9)[0]
    plain = FactorizedStudent(2, N_SEQ, D, D, seed=5).requires_grad_()
    optimizer = torch.optim.Adam(plain.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=(final_lr / lr) ** (1 / (steps - 1)))
    generator = torch.Generator().manual_seed(9)
    history = []
    for _ in range(steps):
        X = torch.randn(batch, N_SEQ, D, generator=generator, dtype=torch.float64)
        loss = ((plain(X) - TEACHER(X)) ** 2).sum((1, 2)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        history.append(loss.item())
    np.testing.assert_allclose(result.history, history, rtol=1e-9)
    np.testing.assert_allclose(fast.V, plain.V, rtol=1e-8, atol=1e-12)


def test_trained_students_reach_the_closed_form_optimum():
    # H >= k: near-exact.  H < k: never below the optimum (a theorem), and close to it.
    students = [FactorizedStudent(H, N_SEQ, D, D, seed=H) for H in (1, 2, 3, 4)]
    results = train_factorized(students, TEACHER, steps=1500, seed=0)
    optimum = optimal_head_errors(TEACHER, N_SEQ, 4)
    for student, result in zip(students, results):
        assert isinstance(result, TrainResult)
        assert result.error == pytest.approx(population_error(TEACHER, student, N_SEQ))
        if student.H >= 3:
            assert result.error <= 1e-6 * optimum[0]
        else:
            assert result.error >= optimum[student.H] * (1 - 1e-9)
            assert result.error <= 1.05 * optimum[student.H]


def test_softmax_student_trains_in_place():
    student = SoftmaxStudent(2, N_SEQ, D, D, seed=0)
    assert isinstance(student, SoftmaxAttention) and student.H == 2 and student.max_length == N_SEQ
    assert np.array_equal(student.position_bias, np.zeros((2, N_SEQ)))  # uniform weights at first
    before = held_out_error(TEACHER, student, N_SEQ)
    lines = []
    result = train(student, TEACHER, steps=100, batch=16, seed=0, progress=lines.append)
    assert len(lines) == 10 and "step 100/100" in lines[-1]
    assert result.error < before and result.error == held_out_error(TEACHER, student, N_SEQ)
    assert np.abs(student.position_bias).max() > 0  # the biases trained
    assert held_out_error(TEACHER, TEACHER, N_SEQ, samples=64) == 0.0


def test_held_out_error_matches_closed_form_for_relative_heads():
    # Two checks: (1) the estimate is the mean over the documented fixed batch (tokens from
    # torch.Generator().manual_seed(20251217)), recomputed here with numpy from the dense operators;
    # (2) it agrees with the closed form within 4 standard errors of that batch.
    model = FactorizedStudent(2, N_SEQ, D, D, seed=1)
    closed = population_error(TEACHER, model, N_SEQ)
    samples = 8192
    X = torch.randn(samples, N_SEQ, D, generator=torch.Generator().manual_seed(20251217),
                    dtype=torch.float64).numpy()
    W = np.asarray(TEACHER.operator(X[0])) - np.asarray(model.operator(X[0]))
    per_sequence = (np.einsum("ijpd,bjd->bip", W, X) ** 2).sum(axis=(1, 2))
    estimate = held_out_error(TEACHER, model, N_SEQ, samples=samples)
    assert estimate == pytest.approx(per_sequence.mean(), rel=1e-12)
    assert abs(estimate - closed) < 4 * per_sequence.std() / np.sqrt(samples)


@pytest.mark.parametrize("call, error, match", [
    (lambda: train(FactorizedStudent(1, N_SEQ, D, D), np.eye(2), steps=1), TypeError, "teacher must be a LinearSSM"),
    (lambda: train(FactorizedStudent(1, N_SEQ, 3, D), TEACHER, steps=1), ValueError, "student must have d = 2"),
    (lambda: train(Dense.random(2, 2), TEACHER, steps=1), TypeError, "student must be"),
    (lambda: train(SoftmaxAttention.random(2, 2), TEACHER, steps=1), TypeError, "student must be"),
    (lambda: train(FactorizedStudent(1, N_SEQ, D, D), TEACHER, steps=0), ValueError, "steps must be >= 1"),
    (lambda: train(FactorizedStudent(1, N_SEQ, D, D), TEACHER, batch=1.5), TypeError, "batch must be an integer"),
    (lambda: train(FactorizedStudent(1, N_SEQ, D, D), TEACHER, lr=0.0), ValueError, "lr must be > 0"),
    (lambda: train(SoftmaxStudent(1, N_SEQ, D, D), TEACHER, final_lr=-1.0), ValueError, "final_lr must be > 0"),
    (lambda: train(FactorizedStudent(1, N_SEQ, D, D), TEACHER, progress="print"), TypeError, "progress"),
    (lambda: train(SoftmaxStudent(1, N_SEQ, D, D), TEACHER, seed=-1), ValueError, "seed must be >= 0"),
    (lambda: train_factorized([], TEACHER), TypeError, "students"),
    (lambda: train_factorized([FactorizedStudent(1, 4, D, D), FactorizedStudent(1, 5, D, D)], TEACHER, steps=1),
     ValueError, "students must share one sequence length"),
    (lambda: FactorizedStudent(0, N_SEQ, D, D), ValueError, "H must be >= 1"),
    (lambda: FactorizedStudent(1, 0, D, D), ValueError, "n must be >= 1"),
    (lambda: SoftmaxStudent(1, N_SEQ, D, D, d_k=0), ValueError, "d_k must be >= 1"),
    (lambda: held_out_error(TEACHER, TEACHER, N_SEQ, samples=0), ValueError, "samples must be >= 1"),
    (lambda: held_out_error(TEACHER, RelativeHeads.random(1, 8, 2, 3), N_SEQ), ValueError, "model must map"),
])
def test_bad_inputs_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


# -- device ----------------------------------------------------------------------------------------------
# Only the CPU is exercised here: the book's CI has no GPU.  An unavailable accelerator must be refused
# up front with a ValueError naming `device`, before anything is trained or moved.

UNAVAILABLE = [name for name, available in (("cuda", torch.cuda.is_available()), ("cuda:0", torch.cuda.is_available()),
                                            ("mps", torch.backends.mps.is_available())) if not available]
BAD_DEVICES = ["nonsense", "", "cuda:x", "meta", *UNAVAILABLE]


def test_check_device_resolves_available_accelerators(monkeypatch):
    # The branches for accelerators, with torch.cuda's availability and device count faked: "cuda" means
    # the current device, an index must exist, and an unavailable backend is refused naming the argument.
    assert check_device("cpu") == torch.device("cpu") == check_device(torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert check_device("cuda") == torch.device("cuda", 1)
    assert check_device("cuda:0") == torch.device("cuda", 0)
    assert check_device("cuda:1") == torch.device("cuda", 1)
    for missing in ("cuda:2", "cuda:5"):                 # indices 0 and 1 exist, 2 does not
        with pytest.raises(ValueError, match=f"device '{missing}' does not exist: this machine has 2 cuda"):
            check_device(missing)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="is not available on this machine"):
        check_device("cuda")


@pytest.mark.parametrize("device", BAD_DEVICES)
def test_unknown_or_unavailable_device_is_refused_before_training(device):
    student = FactorizedStudent(1, N_SEQ, D, D, seed=0)
    soft = SoftmaxStudent(1, N_SEQ, D, D, seed=0)
    before = [p.detach().clone() for s in (student, soft) for p in s.parameters()]
    calls = [lambda: train(student, TEACHER, steps=1, device=device),
             lambda: train(soft, TEACHER, steps=1, device=device),
             lambda: train_factorized([student], TEACHER, steps=1, device=device)]
    for call in calls:
        with pytest.raises(ValueError, match="device"):
            call()
    after = [p.detach() for s in (student, soft) for p in s.parameters()]
    assert all(torch.equal(a, b) and b.device.type == "cpu" for a, b in zip(before, after))


@pytest.mark.parametrize("device", [0, None, 1.5])
def test_device_of_the_wrong_type_is_a_type_error(device):
    with pytest.raises(TypeError, match="device must be a str or torch.device"):
        train(FactorizedStudent(1, N_SEQ, D, D), TEACHER, steps=1, device=device)


# -- the one training loop ---------------------------------------------------------------------------------

def _regression(seed=0):
    """y = X w* + noise: a model whose least-squares optimum is known in closed form."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(64, 3, generator=g, dtype=torch.float64)
    return X, X @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)


def test_fit_reaches_the_least_squares_solution_and_restores_the_model():
    X, y = _regression()
    model = Dense(np.zeros((1, 3)))                       # frozen lib parameters: fit makes them trainable

    def batches(generator):
        while True:
            rows = torch.randint(len(X), (16,), generator=generator)
            yield X[rows], y[rows]

    history = fit(model, lambda m, Xb, yb: ((m(Xb)[:, 0] - yb) ** 2).mean(), batches, steps=400, lr=0.05,
                  final_lr=1e-3)
    assert history.shape == (400,) and history.dtype == np.float64 and history[-1] < 1e-3 * history[0]
    np.testing.assert_allclose(model.W[0], torch.linalg.lstsq(X, y[:, None]).solution[:, 0], atol=1e-2)
    assert not any(p.requires_grad for p in model.parameters())   # frozen again afterwards
    again = Dense(np.zeros((1, 3)))
    np.testing.assert_array_equal(history, fit(again, lambda m, Xb, yb: ((m(Xb)[:, 0] - yb) ** 2).mean(),
                                               batches, steps=400, lr=0.05, final_lr=1e-3))


def test_fit_sgd_with_constant_rate_is_the_heavy_ball_method():
    # Two SGD steps on f(w) = ½‖w − t‖² by hand: v₁ = g₀, w₁ = w₀ − η v₁; v₂ = 0.9 v₁ + g₁, w₂ = w₁ − η v₂.
    target = np.array([[1.0, 2.0]])
    model = Dense(np.zeros((1, 2)))
    loss = lambda m, _: 0.5 * ((m._W - torch.as_tensor(target)) ** 2).sum()
    history = fit(model, loss, lambda g: iter(lambda: (torch.zeros(1),), None), steps=2, lr=0.1,
                  optimizer="sgd")
    w0 = np.zeros((1, 2)); v1 = w0 - target; w1 = w0 - 0.1 * v1
    v2 = 0.9 * v1 + (w1 - target); w2 = w1 - 0.1 * v2
    np.testing.assert_allclose(model.W, w2, rtol=1e-14)
    np.testing.assert_allclose(history, [0.5 * (target ** 2).sum(), 0.5 * ((w1 - target) ** 2).sum()], rtol=1e-14)


def test_fit_reports_many_losses_and_refuses_divergence():
    model = Dense(np.ones((2, 2)))
    losses = lambda m, _: (m._W ** 2).sum(1)             # two independent losses, summed for the step
    history = fit(model, losses, lambda g: iter(lambda: (torch.zeros(1),), None), steps=3, lr=0.1)
    assert history.shape == (3, 2)
    exploding = lambda m, _: (m._W * float("inf")).sum()
    with pytest.raises(FloatingPointError, match="training diverged at step 0"):
        fit(Dense(np.ones((2, 2))), exploding, lambda g: iter(lambda: (torch.zeros(1),), None), steps=3, lr=0.1)


@pytest.mark.parametrize("call, error, match", [
    (lambda: fit(np.eye(2), lambda m: 0, lambda g: [], steps=1, lr=0.1), TypeError, "model must be a torch.nn.Module"),
    (lambda: fit(Dense.random(2, 2), 3, lambda g: [], steps=1, lr=0.1), TypeError, "loss and batches must be callable"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=0, lr=0.1), ValueError, "steps must be >= 1"),
    (lambda: fit(Dense.random(2, 2), lambda m: 0, lambda g: [], steps=1, lr=0.1, optimizer="rmsprop"),
     ValueError, "optimizer must be one of 'adam', 'sgd'"),
    (lambda: fit(torch.nn.ReLU(), lambda m: 0, lambda g: [], steps=1, lr=0.1), ValueError, "model must have parameters"),
])
def test_fit_bad_inputs_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


# -- the head-count sweep (train_students) ------------------------------------------------------------------

SECOND = LinearSSM.random(2, D, D, spectral_radius=0.7, seed=4)   # k = 2 on length 8


def test_train_students_factorized_rows_equal_students_built_and_trained_by_hand():
    # The sweep against the plain route: the same students built here (init seed 3 + s), trained by
    # train_factorized on the batch stream of seed 3, errors recomputed by population_error, optima by
    # optimal_head_errors; order teachers × heads × seeds; heads given as a function of k.
    rows = train_students([TEACHER, SECOND], N_SEQ, lambda k: range(1, k + 2), seeds=2, steps=30, seed=3)
    assert [(r["k"], r["H"], r["seed"]) for r in rows] == (
        [(3, H, 3 + s) for H in (1, 2, 3, 4) for s in (0, 1)] + [(2, H, 3 + s) for H in (1, 2, 3) for s in (0, 1)])
    for teacher, k, part in ((TEACHER, 3, rows[:8]), (SECOND, 2, rows[8:])):
        students = [FactorizedStudent(r["H"], N_SEQ, D, D, seed=r["seed"]) for r in part]
        train_factorized(students, teacher, steps=30, seed=3)
        optimum = optimal_head_errors(teacher, N_SEQ, k + 1)
        for row, student in zip(part, students):
            assert row["model"] == "factorized (trained)"
            assert row["error"] == pytest.approx(population_error(teacher, student, N_SEQ), rel=1e-10)
            assert row["optimum"] == optimum[row["H"]] and row["energy"] == optimum[0]
            assert row["relative squared error"] == pytest.approx(row["error"] / optimum[0], rel=1e-15)


def test_train_students_softmax_rows_equal_separate_training_runs():
    rows = train_students([SECOND], N_SEQ, [2, 1], model="softmax", steps=20, batch=8, seed=5)
    assert [(r["k"], r["H"], r["seed"], r["model"]) for r in rows] == [
        (2, 2, 5, "softmax attention (trained)"), (2, 1, 5, "softmax attention (trained)")]
    optimum = optimal_head_errors(SECOND, N_SEQ, 2)
    for row in rows:
        alone = train(SoftmaxStudent(row["H"], N_SEQ, D, D, seed=5), SECOND, steps=20, batch=8, seed=5)
        assert row["error"] == alone.error and row["optimum"] == optimum[row["H"]]


@pytest.mark.parametrize("call, error, match", [
    (lambda: train_students(TEACHER, N_SEQ, [1]), TypeError, "teachers must be a sequence of LinearSSM"),
    (lambda: train_students([np.eye(2)], N_SEQ, [1]), TypeError, "teachers must be a non-empty sequence"),
    (lambda: train_students([], N_SEQ, [1]), TypeError, "teachers must be a non-empty sequence"),
    (lambda: train_students([TEACHER], N_SEQ, 2), TypeError, "heads must be a sequence"),
    (lambda: train_students([TEACHER], N_SEQ, []), ValueError, "heads must give at least one"),
    (lambda: train_students([TEACHER], N_SEQ, [0]), ValueError, r"heads\[...\] must be >= 1"),
    (lambda: train_students([TEACHER], N_SEQ, lambda k: [1.5]), TypeError, r"heads\[...\] must be an integer"),
    (lambda: train_students([TEACHER], N_SEQ, [1], model="rnn"), ValueError, "model must be one of"),
    (lambda: train_students([TEACHER], N_SEQ, [1], seeds=0), ValueError, "seeds must be >= 1"),
    (lambda: train_students([TEACHER], 0, [1]), ValueError, "n must be >= 1"),
    (lambda: train_students([TEACHER], N_SEQ, [1], seed=-2), ValueError, "seed must be >= 0"),
    (lambda: train_students([LinearSSM(0.5 * np.eye(2), np.zeros((2, 2)), np.eye(2))], N_SEQ, [1]),
     ValueError, "teachers must have a non-zero lag"),
])
def test_train_students_bad_inputs_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
