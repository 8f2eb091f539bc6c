"""A nonlinear recurrent network and its exact interaction operator."""

from __future__ import annotations

from typing import Any

import torch

from .base import SequenceMap, batched
from .ssm import LinearSSM


class ElmanRNN(SequenceMap):
    """s_i = tanh(W s_{i−1} + U x_i), y_i = C s_i, s_{−1} = 0 (bias-free); W (N, N), U (N, d), C (p, N).

    {prf:ref}`prop-rnn`: with z_i = W s_{i−1} + U x_i and the secant slopes
    Φ_i = diag(tanh(z_i)/z_i), s_i = Φ_i z_i exactly, so 𝒲_ij(X) = C Φ_i W Φ_{i−1} ⋯ W Φ_j U
    (j <= i): secant slopes, not the Jacobian's derivatives.
    """

    def __init__(self, W: Any, U: Any, C: Any, *, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, W=(W, "N N"), U=(U, "N d"), C=(C, "p N"))
        self.d, self.p, self.N = dims["d"], dims["p"], dims["N"]

    @classmethod
    def random(cls, N: int, d: int, p: int, *, spectral_radius: float = 0.9, seed: Any = 0,
               dtype: torch.dtype = torch.float64) -> "ElmanRNN":
        """The draws of `LinearSSM.random` as (W, U, C) = (A, B, C)."""
        ssm = LinearSSM.random(N, d, p, spectral_radius=spectral_radius, seed=seed)
        return cls(ssm.A.detach(), ssm.B.detach(), ssm.C.detach(), dtype=dtype)

    def _pre_activations(self, X: torch.Tensor) -> torch.Tensor:
        # z_i = W s_{i−1} + U x_i for every i: (b, n, N).
        s, z = X.new_zeros(X.shape[0], self.N), []
        for u in (X @ self.U.T).unbind(1):
            z.append(s @ self.W.T + u)
            s = torch.tanh(z[-1])
        return torch.stack(z, 1)

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self._pre_activations(X)) @ self.C.T

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        z = self._pre_activations(X)
        small = z.abs() < 1e-8                        # tanh(z)/z = 1 − z²/3 + … below 1e-8
        slopes = torch.where(small, 1 - z * z / 3, torch.tanh(z) / torch.where(small, 1.0, z))
        j = torch.arange(n)[:, None, None]
        P, rows = X.new_zeros(b, n, self.N, self.d), []  # P[:, j] = Φ_i W ⋯ Φ_j U, 0 for j > i
        for i in range(n):
            carried = slopes[:, i, None, :, None] * (self.W @ P)
            fresh = (slopes[:, i, :, None] * self.U)[:, None]
            P = torch.where(j < i, carried, torch.where(j == i, fresh, torch.zeros((), dtype=X.dtype)))
            rows.append(self.C @ P)
        return torch.stack(rows, 1)
