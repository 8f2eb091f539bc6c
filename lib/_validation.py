"""Argument checking shared by every module of `lib`.

Every error names the offending argument and what was expected, e.g.
``ValueError: X must have shape (n, 3) or (b, n, 3) with b, n >= 1; got (5, 4)``.

Accepted array types: numpy arrays and torch tensors of a real floating dtype
(float16/32/64, bfloat16).  Nested lists and tuples are converted with
``numpy.asarray`` and must then be floating too, so ``[[1.0, 2.0]]`` is accepted
but ``[[1, 2]]`` (integers) is not.  Integer, bool, complex, object and string
arrays raise TypeError; NaN or inf entries raise ValueError.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

_TORCH_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_DTYPE_NAMES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
    "float": torch.float32,
}


def resolve_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype a model computes in: float64 (default) or float32.

    Accepts torch dtypes, numpy dtypes/types and the strings "float32"/"float64".
    """
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif isinstance(dtype, str):
        resolved = _DTYPE_NAMES.get(dtype)
    else:
        try:
            resolved = _DTYPE_NAMES.get(np.dtype(dtype).name)
        except TypeError:
            resolved = None
    if resolved not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be float32 or float64; got {dtype!r}")
    return resolved


def _type_name(value: Any) -> str:
    return type(value).__name__


def _as_tensor(value: Any, name: str) -> tuple[torch.Tensor, bool]:
    # Type and dtype checks only.  Returns (tensor, was_torch).
    if isinstance(value, torch.Tensor):
        if value.dtype not in _TORCH_FLOATS:
            raise TypeError(f"{name} must have a real floating dtype; got {value.dtype}")
        return value, True
    if isinstance(value, (str, bytes)) or not isinstance(value, (np.ndarray, list, tuple)):
        raise TypeError(f"{name} must be a numpy array or torch tensor; got {_type_name(value)}")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as error:
        raise TypeError(f"{name} could not be converted to an array: {error}") from None
    if array.dtype.kind != "f":
        raise TypeError(f"{name} must have a real floating dtype; got {array.dtype}")
    # np.ascontiguousarray: torch cannot wrap negative strides (e.g. X[::-1]).
    return torch.tensor(np.ascontiguousarray(array)), False


def _check_finite(tensor: torch.Tensor, name: str) -> None:
    finite = torch.isfinite(tensor.detach())
    if not bool(finite.all()):
        raise ValueError(f"{name} must be finite; got {int((~finite).sum())} NaN/inf entries")


def as_real_tensor(value: Any, name: str, *, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, bool]:
    """Convert `value` to a finite real floating torch tensor.

    Returns (tensor, was_torch).  Torch tensors keep their autograd graph (the
    cast to `dtype` is differentiable); numpy arrays and lists are copied.
    """
    tensor, was_torch = _as_tensor(value, name)
    _check_finite(tensor, name)
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    return tensor, was_torch


def check_shape(tensor: torch.Tensor, name: str, shape: tuple, dims: dict[str, int] | None = None,
                *, may_be_empty: tuple[str, ...] = ()) -> dict[str, int]:
    """Check `tensor.shape` against a spec of ints and symbols, binding symbols in `dims`.

    Example: ``check_shape(B, "B", ("N", "d"), {"N": 4})`` binds d from B and, for
    a B of shape (3, 2), raises ``ValueError: B must have shape (N, d) = (4, 2); got (3, 2)``.
    Every size must be >= 1, except the symbols named in `may_be_empty` (e.g. a head
    count H = 0), which may be 0.
    """
    dims = {} if dims is None else dims
    spec = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    got = tuple(tensor.shape)
    if len(got) == len(shape):
        for symbol, size in zip(shape, got):
            if isinstance(symbol, str) and symbol not in dims and (size >= 1 or symbol in may_be_empty):
                dims[symbol] = size
    sizes = tuple(dims.get(s, s) if isinstance(s, str) else s for s in shape)
    expected = f"{spec} = {sizes}" if all(isinstance(s, int) for s in sizes) and sizes != shape else spec
    if len(got) == len(shape) and any(size < 1 and symbol not in may_be_empty for symbol, size in zip(shape, got)):
        allowed = f" (except {', '.join(may_be_empty)})" if may_be_empty else ""
        raise ValueError(f"{name} must have shape {spec} with all sizes >= 1{allowed}; got {got}")
    if got != sizes:
        raise ValueError(f"{name} must have shape {expected}; got {got}")
    return dims


def as_parameter(value: Any, name: str, shape: tuple, dims: dict[str, int], *, dtype: torch.dtype,
                 may_be_empty: tuple[str, ...] = ()) -> torch.Tensor:
    """A model parameter: finite, real, of the symbolic `shape`, cast to `dtype`.

    Torch tensors are used as given (not copied), so gradients can flow into them.
    """
    tensor, _ = _as_tensor(value, name)
    check_shape(tensor, name, shape, dims, may_be_empty=may_be_empty)
    _check_finite(tensor, name)
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def as_sequence(X: Any, d: int | None, *, dtype: torch.dtype | None, name: str = "X",
                max_length: int | None = None) -> tuple[torch.Tensor, bool, bool]:
    """Validate a sequence of shape (n, d) or (b, n, d) (any d if `d` is None).

    Returns (the sequence as a (b, n, d) tensor in `dtype`, was_batched, was_torch).
    """
    tensor, was_torch = _as_tensor(X, name)
    feature = "d" if d is None else str(d)
    shape = tuple(tensor.shape)
    if tensor.ndim not in (2, 3) or min(shape) < 1 or (d is not None and shape[-1] != d):
        raise ValueError(f"{name} must have shape (n, {feature}) or (b, n, {feature}) with b, n >= 1; got {shape}")
    _check_finite(tensor, name)
    if max_length is not None and shape[-2] > max_length:
        raise ValueError(f"{name} must have length n <= {max_length} for this model; got n = {shape[-2]}")
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    batched = tensor.ndim == 3
    return (tensor if batched else tensor.unsqueeze(0)), batched, was_torch


def to_output(tensor: torch.Tensor, as_torch: bool) -> torch.Tensor | np.ndarray:
    """Return torch tensors to torch callers and numpy arrays to everyone else.

    The result is contiguous, so an operator broadcast over a batch (an expanded
    view) never hands out aliased blocks.
    """
    tensor = tensor.contiguous()
    return tensor if as_torch else tensor.detach().cpu().numpy()


def check_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """An integer >= `minimum` (bools are rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {_type_name(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def check_real(value: Any, name: str, *, positive: bool = False, nonnegative: bool = False) -> float:
    """A finite real number, optionally > 0 or >= 0 (bools are rejected)."""
    if isinstance(value, torch.Tensor) and value.ndim == 0 and value.dtype in _TORCH_FLOATS:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {_type_name(value)}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0; got {value}")
    if nonnegative and value < 0:
        raise ValueError(f"{name} must be >= 0; got {value}")
    return value


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """One of a fixed set of strings."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def check_rtol(rtol: Any) -> float:
    """A relative tolerance 0 < rtol < 1."""
    rtol = check_real(rtol, "rtol")
    if not 0 < rtol < 1:
        raise ValueError(f"rtol must satisfy 0 < rtol < 1; got {rtol}")
    return rtol
