"""Jacobian profiles: J_ij = ∂y_i/∂x_j ∈ ℝ^{p×d} by autograd, and their norms against distance.

The norm of J_{i,i−D} against the distance D is a model's gradient profile
({ref}`chap-gradient-highway`). X is one sequence (n, d), numpy or torch; results are float64 numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._validation import as_tensor, check_int
from .base import check_model


def jacobian_blocks(model: Any, X: Any, i: int) -> np.ndarray:
    """J_ij for j = 0..i, shape (i + 1, p, d), by p reverse-mode passes from y_i.

    model: a SequenceMap; X: (n, d) (left untouched); 0 <= i < n. Blocks j > i are not
    computed (they vanish for causal models).
    """
    check_model(model)
    X = as_tensor(X, "X", model.dtype).detach().clone()
    if X.ndim != 2 or X.shape[1] != model.d or X.shape[0] < 1:
        raise ValueError(f"X must have shape (n, {model.d}) (one sequence); got {tuple(X.shape)}")
    i = check_int(i, "i", minimum=0)
    if i >= X.shape[0]:
        raise ValueError(f"i must satisfy 0 <= i < n = {X.shape[0]}; got {i}")
    X.requires_grad_(True)
    with torch.enable_grad():
        y = model(X)[i]  # (p,)
        rows = [torch.autograd.grad(y[k], X, retain_graph=k + 1 < model.p, allow_unused=True)[0]
                if y.requires_grad else None for k in range(model.p)]
    J = torch.stack([torch.zeros_like(X) if row is None else row for row in rows])  # (p, n, d)
    return J[:, : i + 1].transpose(0, 1).detach().to(torch.float64).numpy()


def block_norms(blocks: np.ndarray) -> np.ndarray:
    """Frobenius norms over the last two axes as s‖M/s‖, s = max|M| (tiny blocks do not underflow)."""
    scale = np.abs(blocks).max(axis=(-2, -1))
    safe = np.where(scale > 0, scale, 1.0)
    return scale * np.linalg.norm(blocks / safe[..., None, None], axis=(-2, -1))


def jacobian_norms(model: Any, X: Any, i: int) -> np.ndarray:
    """‖J_ij‖_F for j = 0..i, shape (i + 1,), indexed by position j (``[::-1]`` by distance)."""
    return block_norms(jacobian_blocks(model, X, i))
