"""The base class of every sequence map in the book.

A sequence map ({prf:ref}`def-sequence-map`) takes X of shape (n, d) or (b, n, d)
to Y of shape (n, p) or (b, n, p) and exposes its interaction operator
({prf:ref}`def-interaction-operator`) of shape (n, n, p, d) or (b, n, n, p, d), so that

    model(X) == apply_operator(model.operator(X), X).

Conventions shared by all models:

- inputs are numpy arrays or torch tensors (lists of floats are converted);
  numpy in → numpy out, torch in → torch out (differentiable with autograd);
- computation happens in the model's dtype (float64 unless `dtype=` asked for
  float32); inputs of another floating dtype are cast;
- parameters passed as torch tensors are used as given, so gradients flow into them;
- every model has a seeded constructor `Model.random(..., seed=0)`.

Subclasses implement the batched torch methods `_forward(X) -> (b, n, p)` and
`_operator(X) -> (b, n, n, p, d)` for X of shape (b, n, d), already validated.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ._validation import as_sequence, to_output

__all__ = ["SequenceMap"]


class SequenceMap:
    """A map X ↦ Y with an interaction operator; see the module docstring.

    Attributes:
        d: input width.
        p: output width.
        dtype: torch dtype of the computation (torch.float64 by default).
        causal: whether 𝒲_ij(X) = 0 for j > i for every X ({prf:ref}`def-causal`).
        max_length: longest sequence the model accepts (None: unlimited).
    """

    causal: bool = True
    max_length: int | None = None

    def __init__(self, d: int, p: int, dtype: torch.dtype) -> None:
        self._d = int(d)
        self._p = int(p)
        self._dtype = dtype

    @property
    def d(self) -> int:
        """Input width: tokens x_j ∈ ℝ^d."""
        return self._d

    @property
    def p(self) -> int:
        """Output width: outputs y_i ∈ ℝ^p."""
        return self._p

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of parameters and computation."""
        return self._dtype

    def __call__(self, X: Any) -> torch.Tensor | np.ndarray:
        """Y = model(X).

        Args:
            X: shape (n, d) or (b, n, d); numpy array or torch tensor.

        Returns:
            Y, shape (n, p) or (b, n, p), of the same kind as X.
        """
        return self._apply(self._forward, X)

    def operator(self, X: Any) -> torch.Tensor | np.ndarray:
        """The interaction operator 𝒲(X) ({prf:ref}`def-interaction-operator`).

        Args:
            X: shape (n, d) or (b, n, d); numpy array or torch tensor.

        Returns:
            W with W[..., i, j, :, :] = 𝒲_ij(X), shape (n, n, p, d) or (b, n, n, p, d),
            of the same kind as X.
        """
        return self._apply(self._operator, X)

    def _apply(self, method: Callable[[torch.Tensor], Any], X: Any) -> Any:
        # Validate X, run a batched torch method, and hand back the caller's kind and batching.
        X, batched, was_torch = as_sequence(X, self.d, dtype=self.dtype, max_length=self.max_length)
        out = method(X)
        if isinstance(out, tuple):
            return tuple(to_output(t if batched else t[0], was_torch) for t in out)
        return to_output(out if batched else out[0], was_torch)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        # (b, n, d) -> (b, n, p), in torch, differentiable.
        raise NotImplementedError

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        # (b, n, d) -> (b, n, n, p, d), in torch, differentiable where 𝒲 depends smoothly on X.
        raise NotImplementedError

    def _sizes(self) -> dict[str, int]:
        # Sizes shown by repr; subclasses add theirs (N, heads, ...).
        return {"d": self.d, "p": self.p}

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self._sizes().items())
        return f"{type(self).__name__}({sizes}, dtype={str(self.dtype).removeprefix('torch.')})"


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    # Parameters are handed to readers as independent numpy copies.
    return tensor.detach().cpu().numpy().copy()
