"""The base class of every sequence map in the book: a torch module with an operator.

A sequence map ({prf:ref}`def-sequence-map`) takes X of shape (n, d) or (b, n, d) to Y of
shape (n, p) or (b, n, p) and exposes its interaction operator
({prf:ref}`def-interaction-operator`), of shape (n, n, p, d) or (b, n, n, p, d), so that
``model(X) == apply_operator(model.operator(X), X)``. The object that computes the operator
is the object that trains: every model is a ``torch.nn.Module`` whose parameters are its
math (``LinearSSM`` holds A, B, C), frozen until ``lib.fit`` trains them.

Conventions: numpy in → numpy out (computed without autograd), torch in → torch out
(differentiable); computation in the model's dtype, float64 unless ``dtype=float32``;
arguments are checked once, where a public method is entered. Subclasses implement
``_forward(X)`` and ``_operator(X)`` for a checked X of shape (b, n, d).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._validation import as_parameter, as_sequence, to_output


class SequenceMap(torch.nn.Module):
    """A map X ↦ Y with an interaction operator; see the module docstring.

    Attributes: d (input width), p (output width), dtype, causal ({prf:ref}`def-causal`),
    max_length (longest accepted n, None for any).
    """

    causal: bool = True
    max_length: int | None = None

    def __init__(self, dtype: torch.dtype, d: int = 0, p: int = 0) -> None:
        super().__init__()
        self.dtype, self.d, self.p = dtype, int(d), int(p)

    def forward(self, X: Any, **options) -> torch.Tensor | np.ndarray:
        """Y = model(X): X of shape (n, d) or (b, n, d) → Y of shape (n, p) or (b, n, p)."""
        return self._at_edge(self._forward, X, options)

    def operator(self, X: Any) -> torch.Tensor | np.ndarray:
        """𝒲(X) with W[..., i, j, :, :] = 𝒲_ij(X), shape (n, n, p, d) or (b, n, n, p, d)."""
        return self._at_edge(self._operator, X)

    def _at_edge(self, compute, X: Any, options: dict | None = None) -> Any:
        # Check X once, run the batched torch method, hand back the caller's kind and batching.
        X, batched, was_torch = as_sequence(X, self.d, dtype=self.dtype, max_length=self.max_length)
        with torch.set_grad_enabled(was_torch and torch.is_grad_enabled()):
            out = compute(X, **(options or {}))
        if isinstance(out, tuple):
            return tuple(to_output(t if batched else t[0], was_torch) for t in out)
        return to_output(out if batched else out[0], was_torch)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _set_parameters(self, dims: dict[str, int] | None = None, may_be_empty: tuple[str, ...] = (),
                        **named: tuple[Any, tuple]) -> dict[str, int]:
        """Register ``name=(value, shape)`` as the parameter ``_<name>``, checking the shape.

        Arrays become new parameters, frozen until training asks for gradients (``fit`` or
        ``model.requires_grad_()``), so numerics on torch inputs carry no parameter graph; a
        torch tensor that requires grad is used as given, so gradients flow back into it.
        Returns the sizes the symbolic shapes bind (N, d, p, ...).
        """
        dims = {} if dims is None else dims
        for name, (value, shape) in named.items():
            tensor = as_parameter(value, name, shape, dims, dtype=self.dtype, may_be_empty=may_be_empty)
            if tensor.requires_grad:
                setattr(self, f"_{name}", tensor)
            else:
                self.register_parameter(f"_{name}", torch.nn.Parameter(tensor.clone(), requires_grad=False))
        return dims

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self._sizes().items())
        return f"{sizes}, dtype={str(self.dtype).removeprefix('torch.')}"

    def _sizes(self) -> dict[str, int]:
        return {"d": self.d, "p": self.p}


def exposed(name: str, doc: str = "") -> property:
    """A read-only property: the parameter ``_<name>`` as a numpy view (`_view`)."""
    return property(lambda self: _view(getattr(self, f"_{name}")), doc=doc)


def _view(tensor: torch.Tensor) -> np.ndarray:
    """A read-only numpy view of a parameter (no copy; writing to it raises)."""
    array = tensor.detach().cpu().numpy()
    array.flags.writeable = False
    return array
