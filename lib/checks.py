"""Numerical agreement checks used by notebooks and tests.

The book's rhythm is claim → derivation → code → an immediate check that two forms
agree; these return the number that such a check prints or glues.
"""

from __future__ import annotations

from typing import Any

import torch

from ._validation import as_real_tensor
from .operators import apply_operator

__all__ = ["relative_error", "identity_error"]


def relative_error(actual: Any, expected: Any) -> float:
    """‖actual − expected‖ / ‖expected‖ (Frobenius norms over all entries; absolute error if expected = 0).

    Args:
        actual, expected: arrays or tensors of the same shape.
    """
    actual, _ = as_real_tensor(actual, "actual", dtype=torch.float64)
    expected, _ = as_real_tensor(expected, "expected", dtype=torch.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"actual must have the shape of expected {tuple(expected.shape)}; got {tuple(actual.shape)}")
    error = torch.linalg.vector_norm((actual - expected).detach())
    scale = torch.linalg.vector_norm(expected.detach())
    return float(error / scale) if scale > 0 else float(error)


def identity_error(model: Any, X: Any) -> float:
    """Relative error of the operator identity model(X) = Σ_j 𝒲_ij(X) x_j ({prf:ref}`def-interaction-operator`).

    Args:
        model: a SequenceMap.
        X: shape (n, d) or (b, n, d).
    """
    return relative_error(apply_operator(model.operator(X), X), model(X))
