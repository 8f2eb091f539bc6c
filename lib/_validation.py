"""Argument checks at the edge of `lib`: every error names the argument and what was expected.

For example ``ValueError: X must have shape (n, 3) or (b, n, 3) with b, n >= 1; got (5, 4)``.
Arrays are numpy arrays or torch tensors of a real floating dtype (lists of floats are
converted); integer, bool, complex, object and string arrays raise TypeError, NaN or inf
entries ValueError. Public functions call these once; internal code does not re-check.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_DTYPES = {"float32": torch.float32, "float": torch.float32, "float64": torch.float64,
           "double": torch.float64}


def resolve_dtype(dtype: Any) -> torch.dtype:
    """float32 or float64, from a torch dtype, a numpy dtype or a string."""
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    else:
        try:
            resolved = _DTYPES.get(dtype if isinstance(dtype, str) else np.dtype(dtype).name)
        except TypeError:
            resolved = None
    if resolved not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be float32 or float64; got {dtype!r}")
    return resolved


def as_real_tensor(value: Any, name: str, *, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, bool]:
    """A finite real floating tensor (cast to `dtype` if given) and whether `value` was torch.

    Torch tensors keep their autograd graph; numpy arrays and lists are copied.
    """
    was_torch = isinstance(value, torch.Tensor)
    if was_torch:
        if value.dtype not in _FLOATS:
            raise TypeError(f"{name} must have a real floating dtype; got {value.dtype}")
        tensor = value
    else:
        if isinstance(value, (str, bytes)) or not isinstance(value, (np.ndarray, list, tuple)):
            raise TypeError(f"{name} must be a numpy array or torch tensor; got {type(value).__name__}")
        try:
            array = np.asarray(value)
        except (ValueError, TypeError) as error:
            raise TypeError(f"{name} could not be converted to an array: {error}") from None
        if array.dtype.kind != "f":
            raise TypeError(f"{name} must have a real floating dtype; got {array.dtype}")
        tensor = torch.tensor(np.ascontiguousarray(array))  # torch cannot wrap negative strides
    finite = torch.isfinite(tensor.detach())
    if not bool(finite.all()):
        raise ValueError(f"{name} must be finite; got {int((~finite).sum())} NaN/inf entries")
    return (tensor if dtype is None else tensor.to(dtype)), was_torch


def check_shape(tensor: torch.Tensor, name: str, shape: tuple, dims: dict[str, int] | None = None,
                *, may_be_empty: tuple[str, ...] = ()) -> dict[str, int]:
    """Check `tensor.shape` against ints and symbols, binding new symbols in `dims`.

    ``check_shape(B, "B", ("N", "d"), {"N": 4})`` binds d, and for B of shape (3, 2) raises
    ``B must have shape (N, d) = (4, 2); got (3, 2)``. Sizes must be >= 1 except for the
    symbols in `may_be_empty`.
    """
    dims = {} if dims is None else dims
    spec = "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    got = tuple(tensor.shape)
    if len(got) == len(shape):
        if any(size < 1 and symbol not in may_be_empty for symbol, size in zip(shape, got)):
            allowed = f" (except {', '.join(may_be_empty)})" if may_be_empty else ""
            raise ValueError(f"{name} must have shape {spec} with all sizes >= 1{allowed}; got {got}")
        for symbol, size in zip(shape, got):
            if isinstance(symbol, str):
                dims.setdefault(symbol, size)
    sizes = tuple(dims.get(s, s) if isinstance(s, str) else s for s in shape)
    if got != sizes:
        known = all(isinstance(s, int) for s in sizes) and sizes != shape
        raise ValueError(f"{name} must have shape {spec}{f' = {sizes}' if known else ''}; got {got}")
    return dims


def as_parameter(value: Any, name: str, shape: tuple, dims: dict[str, int], *, dtype: torch.dtype,
                 may_be_empty: tuple[str, ...] = ()) -> torch.Tensor:
    """A model parameter: finite, real, of the symbolic `shape`, in `dtype`."""
    tensor, _ = as_real_tensor(value, name)
    check_shape(tensor, name, shape, dims, may_be_empty=may_be_empty)
    return tensor.to(dtype)


def as_sequence(X: Any, d: int | None, *, dtype: torch.dtype | None, name: str = "X",
                max_length: int | None = None) -> tuple[torch.Tensor, bool, bool]:
    """A sequence (n, d) or (b, n, d) as a (b, n, d) tensor; returns (X, was_batched, was_torch)."""
    tensor, was_torch = as_real_tensor(X, name, dtype=dtype)
    width = "d" if d is None else str(d)
    shape = tuple(tensor.shape)
    if tensor.ndim not in (2, 3) or min(shape) < 1 or (d is not None and shape[-1] != d):
        raise ValueError(f"{name} must have shape (n, {width}) or (b, n, {width}) with b, n >= 1; got {shape}")
    if max_length is not None and shape[-2] > max_length:
        raise ValueError(f"{name} must have length n <= {max_length} for this model; got n = {shape[-2]}")
    batched = tensor.ndim == 3
    return (tensor if batched else tensor.unsqueeze(0)), batched, was_torch


def to_output(tensor: torch.Tensor, as_torch: bool) -> torch.Tensor | np.ndarray:
    """Torch for torch callers, numpy for everyone else; contiguous (no aliased broadcast blocks)."""
    tensor = tensor.contiguous()
    return tensor if as_torch else tensor.detach().cpu().numpy()


def check_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """An integer >= `minimum` (bools are rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def check_real(value: Any, name: str, *, positive: bool = False, nonnegative: bool = False,
               below: float | None = None) -> float:
    """A finite real number, optionally > 0, >= 0, or < `below` (bools are rejected)."""
    if isinstance(value, torch.Tensor) and value.ndim == 0 and value.dtype in _FLOATS:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0; got {value}")
    if nonnegative and value < 0:
        raise ValueError(f"{name} must be >= 0; got {value}")
    if below is not None and value >= below:
        lower = " 0 <" if positive else ""
        raise ValueError(f"{name} must satisfy{lower} {name} < {below:g}; got {value}")
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
