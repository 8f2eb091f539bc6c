"""The contract every model shares (lib.base): the operator identity, batching, torch-module behaviour
(parameters, state_dict, dtype), autograd, and the checks of X — for every model class."""

import numpy as np
import pytest
import torch

import lib
from lib import SequenceMap, apply_operator, relative_error
from lib.base import batched


def softmax_with_bias(d, p, seed, dtype):
    rng = np.random.default_rng(seed)
    W = [rng.standard_normal(shape) / np.sqrt(d) for shape in ((2, 2, d), (2, 2, d), (2, 2, d), (2, p, 2))]
    return lib.SoftmaxAttention(*W, position_bias=rng.standard_normal((2, 12)), dtype=dtype)


# name -> builder(d, p, seed, dtype); models with p = d by construction ignore p.
BUILDERS = {
    "Dense": lambda d, p, s, t: lib.Dense.random(d, p, seed=s, dtype=t),
    "FeedForward": lambda d, p, s, t: lib.FeedForward.random(d, p, m=5, seed=s, dtype=t),
    "CausalConv1d": lambda d, p, s, t: lib.CausalConv1d.random(d, p, r=3, seed=s, dtype=t),
    "KANLayer": lambda d, p, s, t: lib.KANLayer.random(d, p, grid_size=4, grid_range=(-2, 2), seed=s, dtype=t),
    "ElmanRNN": lambda d, p, s, t: lib.ElmanRNN.random(3, d, p, seed=s, dtype=t),
    "LinearSSM": lambda d, p, s, t: lib.LinearSSM.random(3, d, p, seed=s, dtype=t),
    "SelectiveSSM": lambda d, p, s, t: lib.SelectiveSSM.random(d, 3, step_range=(0.05, 1.0), seed=s, dtype=t),
    "SSD": lambda d, p, s, t: lib.SSD.random(d, p, N=3, heads=2 if d % 2 == 0 else 1, step_range=(0.05, 1.0),
                                             seed=s, dtype=t),
    "SoftmaxAttention": lambda d, p, s, t: lib.SoftmaxAttention.random(d, p, heads=2, seed=s, dtype=t),
    "SoftmaxAttention(non-causal)": lambda d, p, s, t: lib.SoftmaxAttention.random(d, p, heads=2, causal=False,
                                                                                  seed=s, dtype=t),
    "SoftmaxAttention(bias)": softmax_with_bias,
    "LinearAttention": lambda d, p, s, t: lib.LinearAttention.random(d, p, heads=2, seed=s, dtype=t),
    "LinearAttention(non-causal)": lambda d, p, s, t: lib.LinearAttention.random(d, p, heads=2, causal=False,
                                                                                seed=s, dtype=t),
    "RelativeHeads": lambda d, p, s, t: lib.RelativeHeads.random(2, 12, d, p, seed=s, dtype=t),
    "DiagonalSSM": lambda d, p, s, t: lib.DiagonalSSM.random(d, 4, step_range=(0.05, 1.0), seed=s, dtype=t),
    "DiagonalSSM(real)": lambda d, p, s, t: lib.DiagonalSSM.random(d, 3, init="real", step_range=(0.05, 1.0),
                                                                   seed=s, dtype=t),
    "SharedStateSSM": lambda d, p, s, t: lib.SharedStateSSM.random(d, 4, step_range=(0.05, 1.0), seed=s, dtype=t),
    "Stack": lambda d, p, s, t: lib.Stack([lib.LinearSSM.random(3, d, d, seed=s, dtype=t),
                                           lib.FeedForward.random(d, p, m=4, seed=s + 1, dtype=t)]),
    "Stack(residual)": lambda d, p, s, t: lib.Stack([lib.SelectiveSSM.random(d, 2, seed=s, dtype=t),
                                                     lib.RelativeHeads.random(1, 12, d, d, seed=s + 1, dtype=t)],
                                                    residual=True),
}
NON_CAUSAL = {"SoftmaxAttention(non-causal)", "LinearAttention(non-causal)"}
MAX_LENGTH = {"SoftmaxAttention(bias)": 12, "RelativeHeads": 12, "Stack(residual)": 12}
PARAMETERS = {
    "Dense": ["W"], "FeedForward": ["W1", "W2"], "CausalConv1d": ["K"],
    "KANLayer": ["silu_weights", "spline_coefficients"], "ElmanRNN": ["W", "U", "C"], "LinearSSM": ["A", "B", "C"],
    "SelectiveSSM": ["A_log", "W_delta", "dt_bias", "W_B", "W_C"],
    "SSD": ["A_log", "W_delta", "dt_bias", "W_B", "W_C", "W_O"],
    "SoftmaxAttention": ["W_Q", "W_K", "W_V", "W_O"], "SoftmaxAttention(non-causal)": ["W_Q", "W_K", "W_V", "W_O"],
    "SoftmaxAttention(bias)": ["W_Q", "W_K", "W_V", "W_O", "position_bias"],
    "LinearAttention": ["W_Q", "W_K", "W_V", "W_O"], "LinearAttention(non-causal)": ["W_Q", "W_K", "W_V", "W_O"],
    "RelativeHeads": ["V", "coefficients"],
    "DiagonalSSM": ["log_dt", "A_log", "A_imag", "C", "D"], "DiagonalSSM(real)": ["log_dt", "A_log", "C", "D"],
    "SharedStateSSM": ["log_dt", "A_log", "A_imag", "B", "C", "D"],
    "Stack": ["layers.0.A", "layers.0.B", "layers.0.C", "layers.1.W1", "layers.1.W2"],
    "Stack(residual)": ["layers.0.A_log", "layers.0.W_delta", "layers.0.dt_bias", "layers.0.W_B", "layers.0.W_C",
                        "layers.1.V", "layers.1.coefficients"],
}


def build(name, d=3, p=2, seed=0, dtype=torch.float64):
    return BUILDERS[name](d, p, seed, dtype)


def inputs(shape, seed=0, dtype=torch.float64):
    return torch.from_numpy(1.5 * np.random.default_rng(seed).standard_normal(shape)).to(dtype)


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("b,n,d,p", [(1, 1, 1, 1), (2, 5, 3, 2), (3, 8, 2, 4)])
def test_def_interaction_operator_identity_holds_for_every_model_batched_or_not(name, b, n, d, p):
    model = build(name, d, p, seed=n)
    X = inputs((b, n, d), seed=n)
    with torch.no_grad():
        Y, W = model(X), model.operator(X)
        assert isinstance(Y, torch.Tensor) and Y.dtype == torch.float64
        assert Y.shape == (b, n, model.p) and W.shape == (b, n, n, model.p, d)
        assert relative_error(apply_operator(W, X), Y) <= 1e-12
        for k in range(b):  # one sequence alone: unbatched in, unbatched out, the same numbers
            Y_k, W_k = model(X[k]), model.operator(X[k])
            assert Y_k.shape == (n, model.p) and W_k.shape == (n, n, model.p, d)
            assert relative_error(Y_k, Y[k]) <= 1e-13 and relative_error(W_k, W[k]) <= 1e-13


@pytest.mark.parametrize("name", BUILDERS)
def test_causal_flag_matches_the_operator_and_the_jacobian(name):
    model = build(name, 2, 2)
    X = inputs((4, 2)).requires_grad_()
    above = np.triu(np.ones((4, 4), dtype=bool), 1)
    W = model.operator(X)
    assert model.causal == (name not in NON_CAUSAL)
    assert bool((W.detach()[above] == 0).all()) == model.causal
    # Autograd: ∂y_i/∂x_j = 0 for j > i exactly when causal; the operator is differentiable in X.
    J = torch.autograd.functional.jacobian(model, X.detach())  # (n, p, n, d)
    assert J.shape == (4, model.p, 4, 2) and torch.isfinite(J).all() and J.abs().sum() > 0
    assert bool((J.permute(0, 2, 1, 3)[above] == 0).all()) == model.causal
    (g,) = torch.autograd.grad(W.sum(), X, allow_unused=True)  # None: an operator independent of X
    assert g is None or torch.isfinite(g).all()


@pytest.mark.parametrize("name", BUILDERS)
def test_models_are_torch_modules_with_named_parameters_that_train(name):
    model = build(name)
    params = dict(model.named_parameters())
    assert isinstance(model, SequenceMap) and isinstance(model, torch.nn.Module)
    assert sorted(params) == sorted(PARAMETERS[name])
    assert all(isinstance(t, torch.nn.Parameter) and t.requires_grad and t.dtype == torch.float64
               for t in params.values())
    model(inputs((2, 6, 3))).square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in params.values())
    assert any(t.grad.abs().sum() > 0 for t in params.values())


def test_parameter_gradient_is_the_closed_form():
    # s_i = a s_{i−1} + x_i, y = s, x = 1: y = (1, 1 + a, 1 + a + a²), dΣy/da = 1 + (1 + 2a) = 3 at a = 0.5.
    model = lib.LinearSSM([[0.5]], [[1.0]], [[1.0]])
    model(torch.ones(3, 1, dtype=torch.float64)).sum().backward()
    assert model.A.grad.item() == pytest.approx(3.0, rel=1e-14)
    assert model.B.grad.item() == pytest.approx(3 + 2 * 0.5 + 0.25, rel=1e-14)  # Σ y / b


@pytest.mark.parametrize("name", BUILDERS)
def test_state_dict_round_trips_strictly(name):
    source, target = build(name, seed=0), build(name, seed=1)
    X = inputs((2, 6, 3))
    state = source.state_dict()
    assert sorted(state) == sorted(PARAMETERS[name])  # parameters only: buffers are derived, not saved
    assert not torch.equal(target(X), source(X))
    target.load_state_dict(state, strict=True)
    assert torch.equal(target(X), source(X)) and torch.equal(target.operator(X), source.operator(X))


@pytest.mark.parametrize("name", BUILDERS)
def test_float32_models_compute_in_float32_and_X_must_follow(name):
    reference = build(name)
    model = build(name).to(torch.float32)
    assert model.dtype == torch.float32
    built = build(name, dtype=torch.float32)  # the dtype argument: the same draws, cast
    for (key, a), (_, b) in zip(model.named_parameters(), built.named_parameters()):
        assert torch.equal(a, b), key
    X = inputs((2, 6, 3))
    with torch.no_grad():
        Y = model(X.float())
        assert Y.dtype == torch.float32 and model.operator(X.float()).dtype == torch.float32
        assert relative_error(Y, reference(X)) < 1e-5
        assert relative_error(apply_operator(model.operator(X.float()), X), Y) < 1e-5
    with pytest.raises(TypeError, match="X must have the model's dtype torch.float32; got torch.float64"):
        model(X)


@pytest.mark.parametrize("name", BUILDERS)
def test_random_constructors_are_seeded(name):
    X = inputs((5, 3))
    with torch.no_grad():
        first, again, other = build(name, seed=7)(X), build(name, seed=7)(X), build(name, seed=8)(X)
    assert torch.equal(first, again) and not torch.allclose(first, other)


# -- set_parameters and batched, on a toy model --------------------------------------------------------


class Scale(SequenceMap):
    """y_i = w ⊙ x_i, with a second output (the input itself) to exercise tuples."""

    def __init__(self, w, extra=None, dtype=torch.float64):
        super().__init__()
        named = {"w": (w, "d")} if extra is None else {"w": (w, "d"), "extra": (extra, "H? d")}
        self.dims = self.set_parameters(dtype, **named)
        self.d = self.p = self.dims["d"]

    @batched
    def forward(self, X):
        return X * self.w

    @batched
    def both(self, X):
        return X * self.w, X.sum(-1)


def test_set_parameters_registers_copies_and_returns_the_sizes():
    w = np.array([1.0, 2.0, 3.0])
    model = Scale(w, extra=np.zeros((0, 3)))
    assert model.dims == {"d": 3, "H": 0}  # "H?" may be 0
    assert isinstance(model.w, torch.nn.Parameter) and model.w.requires_grad
    w[0] = 100.0                            # the model owns a copy
    assert model.w[0].item() == 1.0
    source = torch.ones(3, dtype=torch.float32, requires_grad=True)
    model = Scale(source)
    assert model.w.dtype == torch.float64 and model.w is not source and model.w.grad_fn is None
    with pytest.raises(ValueError, match=r"extra must have shape \(H, d\) .* got \(2, 2\)"):
        Scale(w, extra=np.zeros((2, 2)))
    with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
        Scale(w, dtype=torch.float16)


def test_batched_methods_drop_the_batch_axis_of_every_output():
    model = Scale([1.0, -2.0])
    X = inputs((3, 4, 2))
    assert model.check_input(X) is True and model.check_input(X[0]) is False
    scaled, total = model.both(X)
    one_scaled, one_total = model.both(X[1])
    assert one_scaled.shape == (4, 2) and one_total.shape == (4,)
    assert torch.equal(one_scaled, scaled[1]) and torch.equal(one_total, total[1])
    with pytest.raises(ValueError, match="X must have shape"):
        model.both(X[0, 0])  # batched methods check X first


def test_public_names():
    # A small core: 40 names before the blocks as built (issue 22) added the blocks, their span and
    # the rank-limited head counts.
    assert len(lib.__all__) <= 48 and len(set(lib.__all__)) == len(lib.__all__)
    for name in lib.__all__:
        assert hasattr(lib, name)


# -- bad X: the right exception, naming X ---------------------------------------------------------------

F64 = torch.float64
BAD_X = {
    "numpy": (np.zeros((4, 3)), TypeError, r"X must be a torch tensor of shape \(n, 3\) or \(b, n, 3\); got ndarray"),
    "list": ([[0.0] * 3] * 4, TypeError, "X must be a torch tensor .* got list"),
    "None": (None, TypeError, "X must be a torch tensor .* got NoneType"),
    "float32": (torch.zeros(4, 3), TypeError, "X must have the model's dtype torch.float64; got torch.float32"),
    "int": (torch.zeros(4, 3, dtype=torch.int64), TypeError, "X must have the model's dtype .* got torch.int64"),
    "bool": (torch.zeros(4, 3, dtype=torch.bool), TypeError, "X must have the model's dtype .* got torch.bool"),
    "complex": (torch.zeros(4, 3, dtype=torch.complex128), TypeError, "X must have the model's dtype"),
    "nan": (torch.tensor([[0.0, 0.0, 0.0], [0.0, float("nan"), 0.0]], dtype=F64), ValueError, "X must be finite"),
    "inf": (torch.tensor([[0.0, float("inf"), 0.0]], dtype=F64), ValueError, "X must be finite"),
    "-inf": (torch.full((2, 1, 3), -float("inf"), dtype=F64), ValueError, "X must be finite"),
}
SHAPE = r"X must have shape \(n, 3\) or \(b, n, 3\) with b, n >= 1; got "
for shape in [(5, 4), (5,), (), (2, 5, 4), (1, 2, 5, 3), (0, 3), (0, 5, 3), (2, 0, 3)]:
    BAD_X[f"shape {shape}"] = (torch.zeros(shape, dtype=F64), ValueError, SHAPE + rf"\({', '.join(map(str, shape))}")


@pytest.mark.parametrize("name", BUILDERS)
def test_bad_X_raises_naming_X(name):
    model = build(name)
    for bad, (X, error, match) in BAD_X.items():
        for method in (model, model.operator):
            with pytest.raises(error, match=match):
                method(X)


@pytest.mark.parametrize("name", MAX_LENGTH)
def test_sequences_longer_than_max_length_are_rejected(name):
    model = build(name)
    assert model.max_length == MAX_LENGTH[name] == 12
    for method in (model, model.operator):
        with pytest.raises(ValueError, match=r"X must have length n <= 12 for this model; got n = 13"):
            method(torch.zeros(2, 13, 3, dtype=F64))
    assert model(torch.zeros(12, 3, dtype=F64)).shape == (12, model.p)


@pytest.mark.parametrize("method", [
    lambda: build("SoftmaxAttention").scores, lambda: build("SoftmaxAttention").weights,
    lambda: build("LinearAttention").weights, lambda: build("SelectiveSSM").selection,
], ids=["softmax scores", "softmax weights", "linear weights", "selection"])
def test_other_methods_of_X_check_X(method):
    for X, error, match in (BAD_X["numpy"], BAD_X["float32"], BAD_X["shape (5, 4)"], BAD_X["nan"]):
        with pytest.raises(error, match=match):
            method()(X)
