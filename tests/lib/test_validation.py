"""Checks at lib's edge (lib._validation), and every model constructor's use of them: a bad parameter,
size or choice raises TypeError (wrong kind) or ValueError (wrong value) naming the argument."""

import numpy as np
import pytest
import torch

import lib
from lib._validation import as_tensor, check_choice, check_int, check_real, check_shape

# -- the helpers -------------------------------------------------------------------------------------


def test_as_tensor_converts_arrays_and_lists_and_keeps_tensors_and_their_graph():
    tensor = as_tensor(np.array([1.0, 2.0], dtype=np.float32), "x")
    assert tensor.dtype == torch.float64 and tensor.tolist() == [1.0, 2.0]
    assert as_tensor([[1.5]], "x").dtype == torch.float64
    assert as_tensor(np.ones(2), "x", torch.float32).dtype == torch.float32
    source = torch.ones(2, dtype=torch.float32, requires_grad=True)
    kept = as_tensor(source, "x")
    assert kept is source
    as_tensor(source, "x", torch.float64).sum().backward()  # the conversion stays on the graph
    assert source.grad.tolist() == [1.0, 1.0]
    array = np.arange(3.0)
    as_tensor(array, "x")[0] = 7.0  # a copy: the caller's array is untouched
    assert array[0] == 0.0
    assert as_tensor(array[::-1], "x").tolist() == [2.0, 1.0, 0.0]  # negative strides are copied, not refused


@pytest.mark.parametrize("value,error,match", [
    (np.zeros(2, dtype=int), TypeError, "x must have a real floating dtype; got int64"),
    (np.zeros(2, dtype=bool), TypeError, "x must have a real floating dtype; got bool"),
    (np.zeros(2, dtype=complex), TypeError, "x must have a real floating dtype; got complex128"),
    (np.array(["a", "b"]), TypeError, "x must have a real floating dtype"),
    (np.array([None, 1.0]), TypeError, "x must have a real floating dtype; got object"),
    ([1, 2], TypeError, "x must have a real floating dtype; got int64"),
    (torch.zeros(2, dtype=torch.int32), TypeError, "x must have a real floating dtype; got torch.int32"),
    (torch.zeros(2, dtype=torch.complex64), TypeError, "x must have a real floating dtype"),
    ("abc", TypeError, "x must be a torch tensor or numpy array; got str"),
    (None, TypeError, "x must be a torch tensor or numpy array; got NoneType"),
    (1.0, TypeError, "x must be a torch tensor or numpy array; got float"),
    (np.float64(1.0), TypeError, "x must be a torch tensor or numpy array; got float64"),
    (np.array([1.0, np.nan]), ValueError, "x must be finite; got NaN or inf entries"),
    (torch.tensor([np.inf]), ValueError, "x must be finite"),
    ([-np.inf], ValueError, "x must be finite"),
])
def test_as_tensor_rejects(value, error, match):
    with pytest.raises(error, match=match):
        as_tensor(value, "x")


def test_check_shape_binds_symbols_and_checks_them_against_later_tensors():
    dims = check_shape(torch.zeros(3, 2), "B", "N d", {})
    assert dims == {"N": 3, "d": 2}
    assert check_shape(torch.zeros(4, 3), "C", "p N", dims) == {"N": 3, "d": 2, "p": 4}
    assert check_shape(torch.zeros(0, 2), "V", "H? d", {}) == {"H": 0, "d": 2}  # "?": zero allowed
    for tensor, name, shape, match in [
        (torch.zeros(2, 2), "C", "p N", r"C must have shape \(p, N\) = \(2, 3\) with sizes >= 1; got \(2, 2\)"),
        (torch.zeros(3), "A", "N N", r"A must have shape \(N, N\) with sizes >= 1; got \(3,\)"),
        (torch.zeros(3, 3, 1), "A", "N N", r"A must have shape \(N, N\)"),
        (torch.zeros(0, 3), "W", "p d", r"W must have shape \(p, d\) with sizes >= 1; got \(0, 3\)"),
        (torch.zeros(()), "b", "d", r"b must have shape \(d,\)"),
    ]:
        with pytest.raises(ValueError, match=match):
            check_shape(tensor, name, shape, {"N": 3})


def test_check_int_real_and_choice():
    assert check_int(3, "n") == 3 and check_int(np.int64(2), "n") == 2 and check_int(0, "seed", 0) == 0
    assert check_real(2, "x") == 2.0 and check_real(np.float32(0.5), "x", low=0, high=1) == 0.5
    assert check_real(0.0, "x", low=0) == 0.0 and check_choice("a", "m", ("a", "b")) == "a"
    for call, error, match in [
        (lambda: check_int(0, "n"), ValueError, "n must be >= 1; got 0"),
        (lambda: check_int(-1, "seed", 0), ValueError, "seed must be >= 0; got -1"),
        (lambda: check_int(True, "n"), TypeError, "n must be an integer; got bool"),
        (lambda: check_int(2.0, "n"), TypeError, "n must be an integer; got float"),
        (lambda: check_int("2", "n"), TypeError, "n must be an integer; got str"),
        (lambda: check_int(None, "n"), TypeError, "n must be an integer; got NoneType"),
        (lambda: check_real(0.0, "x", low=0, open_interval=True), ValueError, r"x must be finite and in \(0, inf\)"),
        (lambda: check_real(1.5, "x", low=0, high=1), ValueError, r"x must be finite and in \[0, 1\]; got 1.5"),
        (lambda: check_real(np.nan, "x"), ValueError, "x must be finite"),
        (lambda: check_real(np.inf, "x"), ValueError, "x must be finite"),
        (lambda: check_real(True, "x"), TypeError, "x must be a real number; got bool"),
        (lambda: check_real(1j, "x"), TypeError, "x must be a real number; got complex"),
        (lambda: check_real("1", "x"), TypeError, "x must be a real number; got str"),
        (lambda: check_real(np.ones(1), "x"), TypeError, "x must be a real number; got ndarray"),
        (lambda: check_choice("c", "method", ("a", "b")), ValueError, "method must be one of 'a', 'b'; got 'c'"),
        (lambda: check_choice(None, "method", ("a",)), ValueError, "method must be one of 'a'; got None"),
    ]:
        with pytest.raises(error, match=match):
            call()


# -- every constructor: each parameter, wrong in every way ----------------------------------------------

# name -> (constructor, {parameter: shape spec}, sizes). Parameters are passed by keyword in this order.
CONSTRUCTORS = {
    "Dense": (lib.Dense, {"W": "p d"}),
    "FeedForward": (lib.FeedForward, {"W1": "m d", "W2": "p m"}),
    "CausalConv1d": (lib.CausalConv1d, {"K": "r p d"}),
    "KANLayer": (lib.KANLayer, {"silu_weights": "p d", "spline_coefficients": "p d M"}),
    "ElmanRNN": (lib.ElmanRNN, {"W": "N N", "U": "N d", "C": "p N"}),
    "LinearSSM": (lib.LinearSSM, {"A": "N N", "B": "N d", "C": "p N"}),
    "SelectiveSSM": (lib.SelectiveSSM, {"A_log": "d N", "W_delta": "d d", "dt_bias": "d", "W_B": "N d",
                                        "W_C": "N d"}),
    "SSD": (lib.SSD, {"A_log": "H", "W_delta": "H d", "dt_bias": "H", "W_B": "N d", "W_C": "N d", "W_O": "p d"}),
    "SoftmaxAttention": (lib.SoftmaxAttention, {"W_Q": "H k d", "W_K": "H k d", "W_V": "H v d", "W_O": "H p v",
                                                "position_bias": "H n"}),
    "LinearAttention": (lib.LinearAttention, {"W_Q": "H k d", "W_K": "H k d", "W_V": "H v d", "W_O": "H p v"}),
    "RelativeHeads": (lib.RelativeHeads, {"V": "H p d", "coefficients": "H n"}),
    "DiagonalSSM": (lib.DiagonalSSM, {"log_dt": "d", "A_log": "d M", "C": "d M two", "D": "d", "A_imag": "d M"}),
    "DiagonalSSM(real)": (lib.DiagonalSSM, {"log_dt": "d", "A_log": "d M", "C": "d M", "D": "d"}),
    "SharedStateSSM": (lib.SharedStateSSM, {"log_dt": "M", "A_log": "M", "A_imag": "M", "B": "M d two",
                                            "C": "d M two", "D": "d"}),
    "LinearSSM.from_continuous": (lambda step=0.1, **k: lib.LinearSSM.from_continuous(step=step, **k),
                                  {"A_c": "N N", "B_c": "N d", "C_c": "p N"}),
}
SIZES = {"d": 4, "p": 3, "N": 5, "m": 6, "r": 2, "M": 7, "H": 2, "k": 3, "v": 2, "n": 8, "two": 2}


def valid(spec):
    rng = np.random.default_rng(0)
    return {name: 0.1 * rng.standard_normal([SIZES[s] for s in shape.split()]) for name, shape in spec.items()}


def wrong_values(spec, name):
    """(label, value, exception, message) for one parameter: each way of being wrong."""
    shape = [SIZES[s] for s in spec[name].split()]
    good = np.full(shape, 0.1)
    cases = [
        ("extra axis", good[..., None], ValueError, "must have shape"),
        ("missing axis", good[..., 0], ValueError, "must have shape"),
        ("empty", np.zeros(shape[:-1] + [0]), ValueError, "must have shape"),
        ("nan", np.where(np.arange(good.size).reshape(shape) == 1, np.nan, good), ValueError, "must be finite"),
        ("inf", np.full(shape, -np.inf), ValueError, "must be finite"),
        ("int", np.ones(shape, dtype=int), TypeError, "must have a real floating dtype"),
        ("bool", np.ones(shape, dtype=bool), TypeError, "must have a real floating dtype"),
        ("complex", good.astype(complex), TypeError, "must have a real floating dtype"),
        ("str", np.full(shape, "a"), TypeError, "must have a real floating dtype"),
        ("torch int", torch.ones(shape, dtype=torch.int64), TypeError, "must have a real floating dtype"),
        ("torch complex", torch.ones(shape, dtype=torch.complex128), TypeError, "must have a real floating dtype"),
        ("scalar", 0.1, TypeError, "must be a torch tensor or numpy array"),
        ("string", "W", TypeError, "must be a torch tensor or numpy array"),
    ]
    if name not in ("A_imag", "position_bias"):  # None is a valid choice for the optional ones
        cases.append(("None", None, TypeError, "must be a torch tensor or numpy array"))
    # A size that disagrees with an earlier parameter (or an earlier axis of this one) sharing its symbol.
    seen = [s for other in list(spec)[:list(spec).index(name)] for s in spec[other].split()]
    symbols = spec[name].split()
    for axis, symbol in enumerate(symbols):
        if symbol in seen or symbol in symbols[:axis]:
            bad = list(shape)
            bad[axis] += 1
            cases.append((f"{symbol} mismatch", np.full(bad, 0.1), ValueError, "must have shape"))
            break
    return cases


PARAMETER_CASES = [(kind, name) for kind, (_, spec) in CONSTRUCTORS.items() for name in spec]


@pytest.mark.parametrize("kind,name", PARAMETER_CASES, ids=[f"{k}-{n}" for k, n in PARAMETER_CASES])
def test_bad_parameter_raises_naming_it(kind, name):
    build, spec = CONSTRUCTORS[kind]
    build(**valid(spec))  # the valid parameters build
    for label, value, error, match in wrong_values(spec, name):
        with pytest.raises(error, match=f"^{name} {match}"):
            build(**{**valid(spec), name: value})


@pytest.mark.parametrize("kind", CONSTRUCTORS)
def test_bad_dtype_argument_raises_type_error(kind):
    build, spec = CONSTRUCTORS[kind]
    for dtype in (torch.int64, torch.float16, torch.complex128, "float32", np.float32, None):
        with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
            build(**valid(spec), dtype=dtype)


# -- every random constructor: sizes, reals and choices --------------------------------------------------

# name -> (call with keyword arguments, valid arguments); the sizes are checked as integers >= 1.
RANDOM = {
    "Dense.random": (lib.Dense.random, {"d": 3, "p": 2}),
    "FeedForward.random": (lib.FeedForward.random, {"d": 3, "p": 2, "m": 4}),
    "CausalConv1d.random": (lib.CausalConv1d.random, {"d": 3, "p": 2, "r": 2}),
    "KANLayer.random": (lib.KANLayer.random, {"d": 3, "p": 2, "grid_size": 3}),
    "ElmanRNN.random": (lib.ElmanRNN.random, {"N": 3, "d": 2, "p": 2}),
    "LinearSSM.random": (lib.LinearSSM.random, {"N": 3, "d": 2, "p": 2}),
    "SelectiveSSM.random": (lib.SelectiveSSM.random, {"d": 3, "N": 2}),
    "SSD.random": (lib.SSD.random, {"d": 2, "p": 2, "N": 2, "heads": 1}),
    "SoftmaxAttention.random": (lib.SoftmaxAttention.random, {"d": 2, "p": 2, "heads": 1, "d_k": 2, "d_v": 2,
                                                              "max_length": 4}),
    "LinearAttention.random": (lib.LinearAttention.random, {"d": 2, "p": 2, "heads": 1, "d_k": 2, "d_v": 2}),
    "RelativeHeads.random": (lib.RelativeHeads.random, {"H": 1, "n_max": 4, "d": 2, "p": 2}),
    "DiagonalSSM.random": (lib.DiagonalSSM.random, {"d": 2, "N": 2}),
    "SharedStateSSM.random": (lib.SharedStateSSM.random, {"d": 2, "N": 2}),
    "s4d_ssm": (lambda **k: lib.s4d_ssm(spectral_radius=0.5, **k), {"N": 3, "d": 2, "p": 2}),
    "s4d_continuous": (lib.s4d_continuous, {"N": 3, "d": 2, "p": 2}),
    "architecture_zoo": (lib.architecture_zoo, {"d": 2, "p": 2, "heads": 1, "state": 2, "kernel": 2}),
}
BAD_SIZES = [(0, ValueError, "must be >= 1; got 0"), (-2, ValueError, "must be >= 1; got -2"),
             (True, TypeError, "must be an integer; got bool"), (2.0, TypeError, "must be an integer; got float"),
             ("3", TypeError, "must be an integer; got str"), (np.ones(2), TypeError, "must be an integer")]
SIZE_CASES = [(kind, size) for kind, (_, sizes) in RANDOM.items() for size in sizes]


@pytest.mark.parametrize("kind,size", SIZE_CASES, ids=[f"{k}-{s}" for k, s in SIZE_CASES])
def test_bad_size_raises_naming_it(kind, size):
    build, sizes = RANDOM[kind]
    build(**sizes)
    for value, error, match in BAD_SIZES:
        with pytest.raises(error, match=f"^{size} {match}"):
            build(**{**sizes, size: value})


@pytest.mark.parametrize("kind", [k for k in RANDOM if k != "architecture_zoo"])
def test_bad_seed_raises_naming_it_and_every_numpy_seed_is_taken(kind):
    build, sizes = RANDOM[kind]
    for seed, error in ((-1, ValueError), ([3, -1], ValueError), (1.5, TypeError), ("7", TypeError)):
        with pytest.raises(error, match="^seed must be an integer >= 0, a sequence of them"):
            build(**sizes, seed=seed)
    by_int = build(**sizes, seed=7)
    for seed in (np.random.SeedSequence(7), np.random.default_rng(7), np.int64(7)):  # the same stream
        for a, b in zip(state(by_int), state(build(**sizes, seed=seed))):
            np.testing.assert_array_equal(a, b)


def state(built):
    """The parameters of a model, or the arrays a function returns."""
    return [t.numpy(force=True) for t in built.parameters()] if isinstance(built, torch.nn.Module) else built


@pytest.mark.parametrize("call,error,match", [
    (lambda: lib.LinearSSM.random(2, 2, 2, spectral_radius=-0.5), ValueError, "spectral_radius must be finite and in"),
    (lambda: lib.ElmanRNN.random(2, 2, 2, spectral_radius=np.nan), ValueError, "spectral_radius must be finite"),
    (lambda: lib.LinearSSM.random(2, 2, 2, spectral_radius=[0.5]), TypeError, "spectral_radius must be a real"),
    (lambda: lib.s4d_ssm(2, 2, 1.0), ValueError, r"spectral_radius must be finite and in \(0, 1\)"),
    (lambda: lib.s4d_step(0.0), ValueError, r"spectral_radius must be finite and in \(0, 1\)"),
    (lambda: lib.RelativeHeads.random(1, 2, 2, 2, decay=np.inf), ValueError, "decay must be finite"),
    (lambda: lib.RelativeHeads.random(1, 2, 2, 2, scale=-1), ValueError, "scale must be finite and in"),
    (lambda: lib.KANLayer.random(2, 2, grid_range=(1.0, 0.0)), ValueError, r"grid_range\[1\] must be finite and in"),
    (lambda: lib.KANLayer.random(2, 2, grid_range=1.0), TypeError, "grid_range must be a pair"),
    (lambda: lib.SelectiveSSM.random(2, step_range=(-1.0, 1.0)), ValueError, r"step_range\[0\] must be finite"),
    (lambda: lib.SSD.random(2, 2, step_range=(0.1, 0.01)), ValueError, r"step_range\[1\] must be finite"),
    (lambda: lib.DiagonalSSM.random(2, 2, step_range=None), TypeError, "step_range must be a pair"),
    (lambda: lib.SharedStateSSM.random(2, 2, step_range=(0.1, "1")), TypeError, r"step_range\[1\] must be a real"),
    (lambda: lib.DiagonalSSM.random(2, 2, init="Lin"), ValueError, "init must be one of 'lin', 'real'; got 'Lin'"),
    (lambda: lib.s4d_continuous(2, 2, init="hippo"), ValueError, "init must be one of 'lin', 'real'"),
    (lambda: lib.s4d_ssm(2, 2, 0.5, init=1), ValueError, "init must be one of 'lin', 'real'; got 1"),
    (lambda: lib.DiagonalSSM.random(2, 3), ValueError, "N must be even for init='lin'"),
    (lambda: lib.SharedStateSSM.random(2, 3), ValueError, "N must be even"),
    (lambda: lib.SSD.random(3, 2, heads=2), ValueError, "H dividing d = 3"),
    (lambda: lib.SoftmaxAttention.random(2, 2, causal=None), TypeError, "causal must be a bool"),
    (lambda: lib.LinearAttention.random(2, 2, causal=0), TypeError, "causal must be a bool"),
    (lambda: lib.Dense.random(2, 2, dtype=torch.int32), TypeError, "dtype must be torch.float32 or torch.float64"),
    (lambda: lib.s4d_ssm(2, 2, 0.5, dtype="float64"), TypeError, "dtype must be torch.float32 or torch.float64"),
])
def test_bad_real_or_choice_raises_naming_it(call, error, match):
    with pytest.raises(error, match=match):
        call()
