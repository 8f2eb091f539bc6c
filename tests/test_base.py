"""The contract every model shares (lib.base): the operator identity, input kinds,
dtypes, autograd, and input validation — checked for every model class."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lib
import reference_operators as ref
from lib import apply_operator, relative_error

# name -> builder(d, p, seed, dtype) of a model with input width d (and output width p where the model has one).
BUILDERS = {
    "Dense": lambda d, p, s, t: lib.Dense.random(d, p, seed=s, dtype=t),
    "FeedForward": lambda d, p, s, t: lib.FeedForward.random(d, p, m=5, seed=s, dtype=t),
    "CausalConv1d": lambda d, p, s, t: lib.CausalConv1d.random(d, p, r=3, seed=s, dtype=t),
    "KANLayer": lambda d, p, s, t: lib.KANLayer.random(d, p, grid_size=4, grid_range=(-2, 2), seed=s, dtype=t),
    "ElmanRNN": lambda d, p, s, t: lib.ElmanRNN.random(3, d, p, seed=s, dtype=t),
    "LinearSSM": lambda d, p, s, t: lib.LinearSSM.random(3, d, p, seed=s, dtype=t),
    "SelectiveSSM": lambda d, p, s, t: lib.SelectiveSSM.random(d, 3, step_range=(0.05, 1.0), seed=s, dtype=t),
    "SSD": lambda d, p, s, t: lib.SSD.random(d, p, N=3, heads=d if d <= 2 else 1, step_range=(0.05, 1.0),
                                             seed=s, dtype=t),
    "SoftmaxAttention": lambda d, p, s, t: lib.SoftmaxAttention.random(d, p, heads=2, seed=s, dtype=t),
    "SoftmaxAttention(non-causal)": lambda d, p, s, t: lib.SoftmaxAttention.random(d, p, heads=2, causal=False,
                                                                                  seed=s, dtype=t),
    "SoftmaxAttention(bias)": lambda d, p, s, t: lib.SoftmaxAttention(
        *(np.random.default_rng(s).standard_normal(shape) / np.sqrt(d)
          for shape in ((2, 2, d), (2, 2, d), (2, 2, d), (2, p, 2))),
        position_bias=np.random.default_rng(s + 1).standard_normal((2, 12)), dtype=t),
    "LinearAttention": lambda d, p, s, t: lib.LinearAttention.random(d, p, heads=2, seed=s, dtype=t),
    "LinearAttention(non-causal)": lambda d, p, s, t: lib.LinearAttention.random(d, p, heads=2, causal=False,
                                                                                seed=s, dtype=t),
    "RelativeHeads": lambda d, p, s, t: lib.RelativeHeads.random(2, 12, d, p, seed=s, dtype=t),
}


def build(name, d=3, p=2, seed=0, dtype=torch.float64):
    return BUILDERS[name](d, p, seed, dtype)


CAUSAL = {name: "non-causal" not in name for name in BUILDERS}
FAST = settings(max_examples=12, deadline=None)


def inputs(rng, shape):
    return rng.standard_normal(shape) * 1.5


@pytest.mark.parametrize("name", BUILDERS)
@FAST
@given(n=st.integers(1, 8), d=st.integers(1, 4), p=st.integers(1, 4), b=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_def_interaction_operator_identity_holds_for_every_model(name, n, d, p, b, seed):
    """model(X) == apply_operator(model.operator(X), X), batched and unbatched; and both equal
    the chapter's formulas transcribed in numpy (tests/reference_operators.py)."""
    model = build(name, d, p, seed)
    rng = np.random.default_rng(seed + 1)
    X = inputs(rng, (b, n, d))
    Y = model(X)
    W = model.operator(X)
    assert Y.shape == (b, n, model.p) and W.shape == (b, n, n, model.p, d)
    assert relative_error(apply_operator(W, X), Y) <= 1e-10
    if name != "RelativeHeads":  # the others against the numpy transcription of their formulas
        assert relative_error(Y, ref.forward(model, X)) <= 1e-10
        assert relative_error(W, ref.operator(model, X)) <= 1e-10
    # Batching is only bookkeeping: each sequence alone gives the same result.
    for k in range(b):
        assert relative_error(model(X[k]), Y[k]) <= 1e-12
        assert relative_error(model.operator(X[k]), W[k]) <= 1e-12


@pytest.mark.parametrize("name", BUILDERS)
def test_def_causal_flag_matches_operator(name):
    model = build(name)
    X = inputs(np.random.default_rng(0), (6, 3))
    assert model.causal == CAUSAL[name]
    assert lib.is_causal(model.operator(X)) == CAUSAL[name]


@pytest.mark.parametrize("name", BUILDERS)
def test_numpy_in_numpy_out_and_torch_in_torch_out(name):
    model = build(name)
    X = inputs(np.random.default_rng(0), (5, 3))
    Y, W = model(X), model.operator(X)
    assert isinstance(Y, np.ndarray) and isinstance(W, np.ndarray)
    assert Y.dtype == np.float64 and W.dtype == np.float64
    Yt, Wt = model(torch.tensor(X)), model.operator(torch.tensor(X))
    assert isinstance(Yt, torch.Tensor) and isinstance(Wt, torch.Tensor)
    np.testing.assert_allclose(Yt.numpy(), Y, rtol=1e-13, atol=1e-15)
    # float32 inputs are cast to the model's float64; lists of floats are accepted.
    assert model(torch.tensor(X, dtype=torch.float32)).dtype == torch.float64
    np.testing.assert_allclose(model(X.tolist()), Y, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", BUILDERS)
def test_gradients_flow_through_call_and_operator(name):
    model = build(name, 2, 2)
    X = torch.tensor(inputs(np.random.default_rng(0), (4, 2)), requires_grad=True)
    J = torch.autograd.functional.jacobian(model, X)  # (n, p, n, d)
    assert J.shape == (4, model.p, 4, 2) and torch.isfinite(J).all()
    assert J.abs().sum() > 0
    if CAUSAL[name]:
        # ∂y_i/∂x_j = 0 for j > i.
        for i in range(4):
            assert (J[i, :, i + 1:] == 0).all()
    W = model.operator(X)
    if W.requires_grad:  # operators that depend smoothly on X
        W.sum().backward()
        assert X.grad is not None and torch.isfinite(X.grad).all()


@pytest.mark.parametrize("name", BUILDERS)
def test_float32_models_compute_in_float32(name):
    model32 = build(name, dtype=torch.float32)
    X = inputs(np.random.default_rng(0), (5, 3))
    Y = model32(X)
    assert Y.dtype == np.float32 and model32.dtype == torch.float32
    assert relative_error(Y, build(name)(X)) < 1e-5
    assert relative_error(apply_operator(model32.operator(X), X.astype(np.float32)), Y) < 1e-5


@pytest.mark.parametrize("name", BUILDERS)
def test_random_constructors_are_seeded(name):
    X = inputs(np.random.default_rng(0), (5, 3))
    same = build(name, seed=7)(X), build(name, seed=7)(X)
    other = build(name, seed=8)(X)
    np.testing.assert_array_equal(same[0], same[1])
    assert not np.allclose(same[0], other)


# -- bad inputs: the right exception, naming the argument -------------------

BAD_SHAPES = [(5, 4), (5,), (2, 5, 4), (1, 2, 5, 3), (0, 3), (0, 5, 3), (2, 0, 3)]


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("shape", BAD_SHAPES)
def test_wrong_shape_raises_value_error_naming_X(name, shape):
    model = build(name)
    X = np.zeros(shape)
    for method in (model, model.operator):
        with pytest.raises(ValueError, match=r"X must have shape \(n, 3\) or \(b, n, 3\)"):
            method(X)


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_raises_value_error(name, bad):
    model = build(name)
    X = np.zeros((4, 3))
    X[2, 1] = bad
    with pytest.raises(ValueError, match="X must be finite"):
        model(X)
    with pytest.raises(ValueError, match="X must be finite"):
        model.operator(torch.tensor(X))


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("X", [
    np.zeros((4, 3), dtype=complex), np.zeros((4, 3), dtype=bool), np.zeros((4, 3), dtype=int),
    np.zeros((4, 3), dtype=object), np.array([["a"] * 3] * 4), torch.zeros(4, 3, dtype=torch.int64),
    torch.zeros(4, 3, dtype=torch.complex128), torch.zeros(4, 3, dtype=torch.bool), [[1, 2, 3]],
], ids=["complex", "bool", "int", "object", "str-array", "torch-int", "torch-complex", "torch-bool", "int-list"])
def test_wrong_dtype_raises_type_error(name, X):
    model = build(name)
    with pytest.raises(TypeError, match="X must have a real floating dtype"):
        model(X)


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("X", ["abc", None, 3.0, {"a": 1}])
def test_wrong_type_raises_type_error(name, X):
    model = build(name)
    with pytest.raises(TypeError, match="X must be a numpy array or torch tensor"):
        model(X)


@pytest.mark.parametrize("name", ["RelativeHeads", "SoftmaxAttention(bias)"])
def test_sequences_longer_than_n_max_are_rejected(name):
    model = build(name)
    with pytest.raises(ValueError, match=r"X must have length n <= 12"):
        model(np.zeros((13, 3)))
    assert model(np.zeros((12, 3))).shape == (12, 2)


def test_repr_names_sizes():
    assert repr(lib.LinearSSM.random(4, 3, 2)) == "LinearSSM(N=4, d=3, p=2, dtype=float64)"
