"""Constructors validate their parameters with errors that name the argument (lib._validation)."""

import numpy as np
import pytest
import torch

import lib
from lib import (SSD, CausalConv1d, Dense, ElmanRNN, FeedForward, KANLayer, LinearAttention, LinearSSM,
                 RelativeHeads, SelectiveSSM, SoftmaxAttention)

Z = np.zeros


@pytest.mark.parametrize("build,match", [
    (lambda: LinearSSM(Z((3, 2)), Z((3, 1)), Z((1, 3))), r"A must have shape \(N, N\) = \(3, 3\); got \(3, 2\)"),
    (lambda: LinearSSM(Z((3, 3)), Z((2, 1)), Z((1, 3))), r"B must have shape \(N, d\) = \(3, 1\); got \(2, 1\)"),
    (lambda: LinearSSM(Z((3, 3)), Z((3, 1)), Z((1, 2))), r"C must have shape \(p, N\) = \(1, 3\); got \(1, 2\)"),
    (lambda: LinearSSM(Z((3, 3)), Z((3,)), Z((1, 3))), r"B must have shape \(N, d\)"),
    (lambda: LinearSSM(Z((0, 0)), Z((0, 1)), Z((1, 0))), r"A must have shape \(N, N\) with all sizes >= 1"),
    (lambda: Dense(Z((2,))), r"W must have shape \(p, d\)"),
    (lambda: FeedForward(Z((4, 3)), Z((2, 5))), r"W2 must have shape \(p, m\) = \(2, 4\); got \(2, 5\)"),
    (lambda: CausalConv1d(Z((3, 2))), r"K must have shape \(r, p, d\)"),
    (lambda: ElmanRNN(Z((3, 3)), Z((3, 2)), Z((2, 4))), r"C must have shape \(p, N\) = \(2, 3\)"),
    (lambda: KANLayer(Z((2, 3)), Z((2, 3, 3))), r"spline_coefficients must have shape \(p, d, G \+ 3\)"),
    (lambda: KANLayer(Z((2, 3)), Z((2, 3, 6)), grid_range=(1, -1)), "grid_range must satisfy lo < hi"),
    (lambda: SelectiveSSM(Z((2, 4)), Z((2, 2)), Z((3,)), Z((4, 2)), Z((4, 2))), r"b_delta must have shape \(d,\)"),
    (lambda: SoftmaxAttention(Z((2, 3, 4)), Z((2, 3, 4)), Z((2, 2, 4)), Z((1, 3, 2))), r"W_O must have shape"),
    (lambda: LinearAttention(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 2, 4)), Z((2, 3, 2))), r"W_K must have shape"),
    (lambda: RelativeHeads(Z((2, 2, 2)), Z((2,))), r"coefficients must have shape \(H, n_max\)"),
    (lambda: LinearSSM(np.full((2, 2), np.inf), Z((2, 1)), Z((1, 2))), "A must be finite"),
])
def test_bad_parameter_shapes_and_values_raise_value_error(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("build,match", [
    (lambda: LinearSSM(Z((2, 2), dtype=complex), Z((2, 1)), Z((1, 2))), "A must have a real floating dtype"),
    (lambda: LinearSSM(Z((2, 2)), "B", Z((1, 2))), "B must be a numpy array or torch tensor"),
    (lambda: Dense(Z((2, 2), dtype=int)), "W must have a real floating dtype"),
    (lambda: Dense(torch.zeros(2, 2, dtype=torch.int32)), "W must have a real floating dtype"),
    (lambda: Dense(Z((2, 2)), dtype=torch.int64), "dtype must be float32 or float64"),
    (lambda: Dense(Z((2, 2)), dtype="complex64"), "dtype must be float32 or float64"),
    (lambda: SoftmaxAttention.random(2, 2, causal=1), "causal must be a bool"),
    (lambda: LinearSSM.random(2.5, 2, 2), "N must be an integer"),
    (lambda: LinearSSM.random(2, 2, 2, spectral_radius="big"), "spectral_radius must be a real number"),
    (lambda: LinearSSM.diagonal("abc", Z((1, 1)), Z((1, 1))), "eigenvalues must be an array"),
])
def test_bad_parameter_types_raise_type_error(build, match):
    with pytest.raises(TypeError, match=match):
        build()


def test_sizes_must_be_positive():
    with pytest.raises(ValueError, match="N must be >= 1"):
        LinearSSM.random(0, 2, 2)
    with pytest.raises(ValueError, match="heads must be >= 1"):
        SSD.random(2, 2, heads=0)


def test_dtype_argument_accepts_numpy_torch_and_strings():
    for dtype in (torch.float32, np.float32, "float32"):
        assert Dense.random(2, 2, dtype=dtype).dtype == torch.float32
    assert Dense.random(2, 2).dtype == torch.float64


def test_torch_parameters_keep_their_gradient():
    A = torch.tensor([[0.5]], dtype=torch.float64, requires_grad=True)
    model = LinearSSM(A, torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64))
    model(torch.ones(3, 1, dtype=torch.float64)).sum().backward()
    # y = (1, 1 + a, 1 + a + a²): dΣy/da = 1 + (1 + 2a) = 3 at a = 0.5.
    assert A.grad.item() == pytest.approx(3.0)


def test_parameters_are_read_only_numpy_views():
    model = LinearSSM.random(2, 1, 1)
    A = model.A
    with pytest.raises(ValueError, match="read-only"):
        A[:] = 0
    assert np.shares_memory(A, model.A) and np.abs(model.A).max() > 0


def test_models_are_modules_with_frozen_parameters():
    model = LinearSSM.random(3, 2, 2)
    assert isinstance(model, torch.nn.Module)
    assert [name for name, _ in model.named_parameters()] == ["_A", "_B", "_C"]
    assert not any(p.requires_grad for p in model.parameters())
    out = model(torch.ones(4, 2, dtype=torch.float64))
    assert not out.requires_grad  # numerics on torch inputs carry no parameter graph
    model.requires_grad_()
    model(torch.ones(4, 2, dtype=torch.float64)).sum().backward()
    assert model._A.grad is not None and model._A.grad.abs().sum() > 0


def test_public_names():
    for name in lib.__all__:
        assert hasattr(lib, name)


def test_reversed_numpy_views_are_accepted():
    # Negative strides (X[::-1]) are copied, not rejected by torch.
    from lib import LinearSSM

    model = LinearSSM.random(3, 2, 2, seed=1)
    X = np.random.default_rng(0).standard_normal((6, 2))
    np.testing.assert_allclose(model(X[::-1]), model(X[::-1].copy()), rtol=0, atol=0)
