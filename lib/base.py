"""The base class of every model: a torch module with an interaction operator.

A sequence map ({prf:ref}`def-sequence-map`) takes X of shape (b, n, d) to Y of shape
(b, n, p); its `operator(X)` is 𝒲(X) of shape (b, n, n, p, d) with W[:, i, j] = 𝒲_ij
(0-based positions), so that y_i = Σ_j 𝒲_ij(X) x_j ({prf:ref}`def-interaction-operator`).
Methods decorated with `batched` also take one sequence (n, d) and then drop the batch axis.
Tensors in, tensors out, in the dtype of the model's parameters.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ._validation import as_tensor, check_dtype, check_shape


class SequenceMap(torch.nn.Module):
    """A map X ↦ Y with an operator 𝒲(X). Attributes: d, p, causal, max_length (None: any n)."""

    d: int
    p: int
    causal: bool = True
    max_length: int | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the parameters, in which the model computes."""
        return next(self.parameters()).dtype

    def set_parameters(self, dtype: torch.dtype, dims: dict[str, int] | None = None,
                       **named: tuple[Any, str]) -> dict[str, int]:
        """Register each ``name=(value, "N d")`` as an nn.Parameter of that shape; return the sizes.

        Values are copied into `dtype` (float32 or float64); a shape symbol ending in "?" may be 0.
        """
        check_dtype(dtype)
        dims = {} if dims is None else dims
        for name, (value, shape) in named.items():
            tensor = as_tensor(value, name)
            check_shape(tensor, name, shape, dims)
            self.register_parameter(name, torch.nn.Parameter(tensor.detach().to(dtype).clone()))
        return dims

    def check_input(self, X: Any, name: str = "X") -> bool:
        """Check X against the model (tensor, dtype, shape, length, finite); True if batched."""
        shape = f"(n, {self.d}) or (b, n, {self.d})"
        if not isinstance(X, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor of shape {shape}; got {type(X).__name__} "
                            "(torch.from_numpy converts an array)")
        if X.dtype != self.dtype:
            raise TypeError(f"{name} must have the model's dtype {self.dtype}; got {X.dtype}")
        if X.ndim not in (2, 3) or X.shape[-1] != self.d or min(X.shape) < 1:
            raise ValueError(f"{name} must have shape {shape} with b, n >= 1; got {tuple(X.shape)}")
        if self.max_length is not None and X.shape[-2] > self.max_length:
            raise ValueError(f"{name} must have length n <= {self.max_length} for this model; "
                             f"got n = {X.shape[-2]}")
        if not bool(torch.isfinite(X.detach()).all()):
            raise ValueError(f"{name} must be finite; got NaN or inf entries")
        return X.ndim == 3


def check_model(model: Any, name: str = "model") -> SequenceMap:
    if not isinstance(model, SequenceMap):
        raise TypeError(f"{name} must be a SequenceMap; got {type(model).__name__}")
    return model


def batched(method: Callable) -> Callable:
    """Let a method of X (b, n, d) take one sequence (n, d) too; X is checked first."""

    @functools.wraps(method)
    def wrapper(self: SequenceMap, X: torch.Tensor, *args, **kwargs):
        if self.check_input(X):
            return method(self, X, *args, **kwargs)
        out = method(self, X[None], *args, **kwargs)
        return tuple(t[0] for t in out) if isinstance(out, tuple) else out[0]

    return wrapper
