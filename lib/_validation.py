"""Checks at lib's edge: every error names the argument and says what was expected.

Models check their parameters when built and X when called; analysis functions check what
could otherwise give a silently wrong number. Code inside lib trusts what it is handed.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch


def as_tensor(value: Any, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A finite real floating tensor from a tensor, a numpy array or a list of floats.

    Tensors keep their graph; arrays become float64 unless `dtype` is given.
    """
    if isinstance(value, torch.Tensor):
        tensor = value
    elif isinstance(value, (np.ndarray, list, tuple)):
        array = np.asarray(value)
        if array.dtype.kind != "f":
            raise TypeError(f"{name} must have a real floating dtype; got {array.dtype}")
        tensor = torch.from_numpy(np.array(array, dtype=np.float64))
    else:
        raise TypeError(f"{name} must be a torch tensor or numpy array; got {type(value).__name__}")
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must have a real floating dtype; got {tensor.dtype}")
    if not bool(torch.isfinite(tensor.detach()).all()):
        raise ValueError(f"{name} must be finite; got NaN or inf entries")
    return tensor if dtype is None else tensor.to(dtype)


def check_shape(tensor: torch.Tensor, name: str, shape: str, dims: dict[str, int]) -> dict[str, int]:
    """Check `tensor.shape` against a spec like "N d", binding new symbols in `dims`.

    Sizes must be >= 1, except where a symbol ends in "?" ("H?": zero heads allowed).
    """
    symbols = shape.split()
    got = tuple(tensor.shape)
    spec = f"({', '.join(s.rstrip('?') for s in symbols)}{',' if len(symbols) == 1 else ''})"
    if len(got) == len(symbols):
        for symbol, size in zip(symbols, got):
            dims.setdefault(symbol.rstrip("?"), size)
    expected = tuple(dims.get(s.rstrip("?"), -1) for s in symbols)
    empty = any(size < 1 and not s.endswith("?") for s, size in zip(symbols, got))
    if got != expected or empty:
        known = f" = {expected}" if len(got) == len(symbols) and not empty else ""
        raise ValueError(f"{name} must have shape {spec}{known} with sizes >= 1; got {got}")
    return dims


def check_int(value: Any, name: str, minimum: int = 1) -> int:
    """An integer >= `minimum` (bools are rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def check_real(value: Any, name: str, low: float = -np.inf, high: float = np.inf,
               open_interval: bool = False) -> float:
    """A finite real number in [low, high] (or (low, high) if `open_interval`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    value = float(value)
    inside = low < value < high if open_interval else low <= value <= high
    if not (np.isfinite(value) and inside):
        bounds = f"({low:g}, {high:g})" if open_interval else f"[{low:g}, {high:g}]"
        raise ValueError(f"{name} must be finite and in {bounds}; got {value}")
    return value


def check_dtype(dtype: Any) -> torch.dtype:
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64; got {dtype!r}")
    return dtype


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """One of a fixed set of strings."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def as_generator(seed: Any) -> np.random.Generator:
    """np.random.default_rng(seed) (an int >= 0, a sequence of them, a SeedSequence, a Generator or
    None), its errors naming seed."""
    try:
        return np.random.default_rng(seed)
    except (TypeError, ValueError) as error:
        raise type(error)("seed must be an integer >= 0, a sequence of them, a SeedSequence or a Generator; "
                          f"got {seed!r}") from error
