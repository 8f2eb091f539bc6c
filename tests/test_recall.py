"""The delayed-recall task and its trainable models (lib.recall)."""

import numpy as np
import pytest
import torch

from lib import LinearSSM, SoftmaxAttention, Stack
from lib.recall import (RecallAttention, RecallHybrid, RecallResult, RecallSSM, RecallTask, initial_gradient_norm,
                        recall_model, recall_sweep, signal_sweep, stable_ssm, train_recall)


def logits(model, X):
    """The recall models are read at the last position."""
    return model(X)[:, -1]


def radius_angle(ssm):
    return ssm.parametrizations["_A"].original


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny tensors: OpenMP hand-offs between threads cost more than the work (10x on a busy machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_task_places_the_class_token_D_before_the_end():
    task = RecallTask(5, classes=4, noise=0.3, lead=2)
    assert task.length == 8
    X, y = task.sample(500, torch.Generator().manual_seed(0))
    assert X.shape == (500, 8, 4) and X.dtype == torch.float64 and y.shape == (500,)
    position = task.length - 1 - task.distance
    assert position == task.lead
    np.testing.assert_array_equal(X[:, position].numpy(), np.eye(4)[y.numpy()])
    background = torch.cat([X[:, :position], X[:, position + 1:]], 1)
    assert background.std().item() == pytest.approx(0.3, rel=0.05)
    assert set(y.tolist()) == {0, 1, 2, 3}
    X2, y2 = task.sample(500, torch.Generator().manual_seed(0))
    assert torch.equal(X, X2) and torch.equal(y, y2)


def test_ssm_model_is_a_stable_lib_linear_ssm():
    model = stable_ssm(4, state_size=6, seed=0)
    assert isinstance(model, LinearSSM) and (model.N, model.d, model.p) == (6, 4, 4)
    radii = np.abs(np.linalg.eigvals(model.A))
    assert np.all((0.85 <= radii) & (radii <= 0.95))
    # A is the rotation-scaling blocks of (sigmoid(ν_k), θ_k), rebuilt here in numpy.
    nu, theta = radius_angle(model).detach().numpy().T
    r = 1 / (1 + np.exp(-nu))
    A = np.zeros((6, 6))
    for k in range(3):
        A[2 * k:2 * k + 2, 2 * k:2 * k + 2] = r[k] * np.array([[np.cos(theta[k]), -np.sin(theta[k])],
                                                               [np.sin(theta[k]), np.cos(theta[k])]])
    np.testing.assert_allclose(model.A, A, rtol=1e-14, atol=1e-15)
    with torch.no_grad():
        radius_angle(model)[:, 0].fill_(40.0)  # any parameter value stays inside the unit disk
    assert np.abs(np.linalg.eigvals(model.A)).max() <= 1.0
    assert [name for name, _ in model.named_parameters()] == ["_B", "_C", "parametrizations._A.original"]
    assert RecallSSM(4, state_size=6, seed=0).A.tolist() == stable_ssm(4, state_size=6, seed=0).A.tolist()


def test_attention_and_hybrid_models_are_lib_models():
    X = torch.randn(3, 9, 4, dtype=torch.float64)
    task = RecallTask(11, classes=4)
    attention = recall_model("attention", task, seed=0)
    g = torch.Generator().manual_seed(0)  # the documented init: W_Q, W_K, W_V, W_O ~ N(0, 1/K), zero biases
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        np.testing.assert_array_equal(getattr(attention, name), 0.5 * torch.randn(1, 4, 4, generator=g,
                                                                                 dtype=torch.float64).numpy())
    assert isinstance(attention, SoftmaxAttention) and attention.max_length == 12
    assert np.array_equal(attention.position_bias, np.zeros((1, 12)))
    hybrid = recall_model("hybrid", task, seed=0)
    assert isinstance(hybrid, Stack) and not hybrid.residual and hybrid.layers[0].residual
    ssm, head = hybrid.layers[0].layers[0], hybrid.layers[1]
    # The hybrid is z = x + ssm(x), then attention(z) without a residual: computed by separate calls.
    expected = head(X + ssm(X, method="recurrence"))[:, -1]
    np.testing.assert_allclose(logits(hybrid, X), expected, rtol=1e-12, atol=1e-14)
    assert RecallHybrid(4, max_length=12, seed=0).layers[1].W_Q.tolist() == head.W_Q.tolist()
    assert RecallAttention(4, max_length=12, seed=0).W_Q.tolist() == attention.W_Q.tolist()


def test_train_recall_is_deterministic_and_learns_an_easy_case():
    task = RecallTask(3, classes=4, noise=0.3)
    runs = [train_recall(recall_model(kind, task, seed=5), task, steps=4, seed=1, test_size=32, kind=kind)
            for kind in ("ssm", "ssm", "hybrid", "hybrid")]
    assert runs[0] == runs[1] and runs[2] == runs[3]
    other = train_recall(recall_model("ssm", task, seed=5), task, steps=4, seed=2, test_size=32)
    assert other != runs[0]
    learned = train_recall(recall_model("attention", task, seed=0), task, steps=60, seed=0, test_size=128)
    assert isinstance(learned, RecallResult)
    assert learned.accuracy >= 0.9 and learned.loss < 0.5
    assert (learned.distance, learned.steps, learned.seed) == (3, 60, 0)


def test_train_recall_sgd_steps_are_heavy_ball_steps_on_the_autograd_gradient():
    # optimizer="sgd": p_1 = p_0 − lr g_0, p_2 = p_1 − lr (g_1 + 0.9 g_0) (momentum 0.9), with g_k the
    # gradient of the cross-entropy on batch k of the seeded stream — recomputed here with torch.autograd.
    import torch.nn.functional as F

    task, lr, seed = RecallTask(3, classes=4, noise=0.3), 0.1, 7
    trained = recall_model("ssm", task, seed=0)
    result = train_recall(trained, task, steps=2, optimizer="sgd", lr=lr, seed=seed, batch=5, test_size=16)
    model = recall_model("ssm", task, seed=0).requires_grad_()
    params = list(model.parameters())
    data = torch.Generator().manual_seed(seed)
    previous = None
    for _ in range(2):
        X, y = task.sample(5, data)
        grads = torch.autograd.grad(F.cross_entropy(logits(model, X), y), params)
        velocity = list(grads) if previous is None else [g + 0.9 * v for g, v in zip(grads, previous)]
        with torch.no_grad():
            for p, v in zip(params, velocity):
                p -= lr * v
        previous = velocity
    for expected, got in zip(params, trained.parameters()):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    # The reported accuracy and loss are those of the trained model on the seed + 1_000_003 test batch.
    X_test, y_test = task.sample(16, torch.Generator().manual_seed(seed + 1_000_003))
    with torch.no_grad():
        scores = logits(model, X_test)
    assert result.accuracy == float((scores.argmax(-1) == y_test).double().mean())
    assert result.loss == pytest.approx(float(F.cross_entropy(scores, y_test)), rel=1e-12)


def test_recall_sweep_order_and_progress():
    lines = []
    results = recall_sweep(distances=(1, 2), kinds=("attention", "ssm"), seeds=(0,), steps=2, classes=3,
                           progress=lines.append)
    assert [(r.kind, r.distance) for r in results] == [("attention", 1), ("attention", 2), ("ssm", 1), ("ssm", 2)]
    assert len(lines) == 4 and lines[0].startswith("recall attention")


def test_recall_validation():
    with pytest.raises(ValueError, match="distance must be >= 0"):
        RecallTask(-1)
    with pytest.raises(ValueError, match="classes must be >= 2"):
        RecallTask(3, classes=1)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        RecallTask(3).sample(2, 0)
    with pytest.raises(ValueError, match="kind must be one of"):
        recall_model("rnn", RecallTask(3))
    with pytest.raises(ValueError, match="state_size must be even"):
        RecallSSM(4, state_size=5)
    with pytest.raises(ValueError, match="radius must satisfy"):
        RecallSSM(4, radius=(0.5, 1.0))
    with pytest.raises(ValueError, match="optimizer must be one of"):
        train_recall(recall_model("ssm", RecallTask(2)), 2, steps=1, optimizer="lbfgs")
    with pytest.raises(TypeError, match="model must be a lib SequenceMap"):
        train_recall(torch.nn.Linear(2, 2), 2)
    with pytest.raises(TypeError, match="task must be a RecallTask"):
        train_recall(recall_model("ssm", RecallTask(2)), "2")


# -- device (CPU only here: the book's CI has no GPU) ------------------------------------------------

UNAVAILABLE = [name for name, available in (("cuda", torch.cuda.is_available()),
                                            ("mps", torch.backends.mps.is_available())) if not available]


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_explicit_cpu_device_equals_the_default(device):
    task = RecallTask(3, classes=4, noise=0.3)
    for kind in ("ssm", "attention", "hybrid"):
        models = [recall_model(kind, task, seed=2) for _ in range(2)]
        default = train_recall(models[0], task, steps=4, seed=1, test_size=16, kind=kind)
        explicit = train_recall(models[1], task, steps=4, seed=1, test_size=16, kind=kind, device=device)
        assert default == explicit
        for p0, p1 in zip(models[0].parameters(), models[1].parameters()):
            assert torch.equal(p0, p1) and p1.device.type == "cpu"
    sweep = dict(distances=(1, 2), kinds=("ssm", "attention"), seeds=(0,), steps=2, classes=3)
    assert recall_sweep(**sweep) == recall_sweep(**sweep, device=device)


@pytest.mark.parametrize("device", ["nonsense", "meta", *UNAVAILABLE])
def test_unknown_or_unavailable_device_is_refused(device):
    model = recall_model("attention", RecallTask(2, classes=3))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="device"):
        train_recall(model, RecallTask(2, classes=3), steps=1, device=device)
    with pytest.raises(ValueError, match="device"):
        recall_sweep(distances=(1,), kinds=("ssm",), seeds=(0,), steps=1, classes=3, device=device)
    assert all(torch.equal(a, b) and b.device.type == "cpu" for a, b in zip(before, model.parameters()))


def test_recall_model_passes_the_initial_radius_to_the_ssm_layers():
    import torch

    from lib.recall import RecallTask, recall_model

    task = RecallTask(4)
    for kind in ("ssm", "hybrid"):
        model = recall_model(kind, task, seed=0, radius=(0.99, 0.995))
        layer = model if kind == "ssm" else model.layers[0].layers[0]
        moduli = torch.sigmoid(radius_angle(layer)[:, 0])
        assert bool(((moduli >= 0.99) & (moduli <= 0.995)).all())


def test_initial_gradient_signal_falls_with_distance_for_the_ssm_not_for_attention():
    # thm-ssm-gradient-decay: on a blank background the only path is C A^D B (ρ ≤ 0.95 here);
    # prop-attention-highway: attention's one-hop path does not decay exponentially; at
    # initialisation (zero position bias) its weights are uniform, so the signal goes like 1/n.
    from lib.recall import RecallTask, initial_gradient_norm, recall_model

    def signal(kind, D):
        task = RecallTask(D, noise=0.0)
        return initial_gradient_norm(recall_model(kind, task, seed=3), task, samples=64, seed=1)

    ssm = [signal("ssm", D) for D in (2, 16, 64)]
    attention = [signal("attention", D) for D in (2, 16, 64)]
    assert ssm[0] > ssm[1] > ssm[2]
    assert ssm[2] < 0.95 ** 40 * ssm[0]
    lengths = [D + 1 for D in (2, 16, 64)]
    scaled = [a * n for a, n in zip(attention, lengths)]
    assert max(scaled) < 2 * min(scaled)


def test_initial_gradient_norm_is_the_norm_of_the_loss_gradient_over_all_parameters():
    # Recomputed with torch.autograd.functional on the flattened parameter vector (independent route).
    import torch.nn.functional as F

    task = RecallTask(5, classes=3, noise=0.2)
    model = recall_model("hybrid", task, seed=1)
    X, y = task.sample(32, torch.Generator().manual_seed(4))
    names = [name for name, _ in model.named_parameters()]
    values = tuple(p.detach().clone() for p in model.parameters())

    def loss(*flat):
        out = torch.func.functional_call(model, dict(zip(names, flat)), (X,))
        return F.cross_entropy(out[:, -1], y)

    grads = torch.autograd.functional.jacobian(loss, values)
    expected = float(torch.sqrt(sum((g ** 2).sum() for g in grads)))
    assert initial_gradient_norm(model, task, samples=32, seed=4) == pytest.approx(expected, rel=1e-12)


def test_initial_gradient_norm_is_deterministic_and_leaves_the_model_alone():
    from lib.recall import RecallTask, initial_gradient_norm, recall_model

    task = RecallTask(8)
    model = recall_model("hybrid", task, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    assert initial_gradient_norm(model, task, seed=2) == initial_gradient_norm(model, task, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_signal_sweep_is_the_initial_gradient_of_fresh_models_on_the_blank_task():
    signals = signal_sweep((1, 4), kinds=("ssm", "attention"), seeds=(0, 2), classes=3, samples=16)
    assert [(s.kind, s.distance, s.seed) for s in signals] == [
        (kind, D, seed) for kind in ("ssm", "attention") for D in (1, 4) for seed in (0, 2)]
    for s in signals:
        task = RecallTask(s.distance, classes=3, noise=0.0)
        model = recall_model(s.kind, task, seed=s.seed)
        assert s.gradient_norm == initial_gradient_norm(model, task, samples=16, seed=s.seed)
    # the blank task: the class token is the only input, so an SSM's signal falls with D
    ssm = {s.distance: s.gradient_norm for s in signals if s.kind == "ssm" and s.seed == 0}
    assert ssm[4] < ssm[1]


def test_signal_sweep_bad_input():
    with pytest.raises(ValueError, match="kind must be one of"):
        signal_sweep((1,), kinds=("rnn",), seeds=(0,))
    with pytest.raises(ValueError, match="distance must be >= 0"):
        signal_sweep((-1,), seeds=(0,))
    with pytest.raises(TypeError, match="seeds entries must be an integer"):
        signal_sweep((1,), kinds=("ssm",), seeds=(0.5,))
    with pytest.raises(ValueError, match="classes must be >= 2"):
        signal_sweep((1,), seeds=(0,), classes=1)
