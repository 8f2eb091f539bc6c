"""A nonlinear recurrent network and its exact interaction operator."""

from __future__ import annotations

from typing import Any

import torch

from ._validation import resolve_dtype
from .base import SequenceMap, exposed
from .ssm import LinearSSM


def _tanh_secant(z: torch.Tensor) -> torch.Tensor:
    """tanh(z)/z, 1 at z = 0 (the series 1 − z²/3 below 1e-8 avoids 0/0)."""
    small = z.abs() < 1e-8
    safe = torch.where(small, torch.ones((), dtype=z.dtype), z)
    return torch.where(small, 1 - z * z / 3, torch.tanh(safe) / safe)


class ElmanRNN(SequenceMap):
    """s_i = tanh(W s_{i−1} + U x_i), y_i = C s_i, s_{−1} = 0 (bias-free).

    Implements {prf:ref}`prop-rnn`: with z_i = W s_{i−1} + U x_i and the secant factors
    Φ_i = diag(tanh(z_i)/z_i), s_i = Φ_i (W s_{i−1} + U x_i) exactly, so
    𝒲_ij(X) = C Φ_i W Φ_{i−1} ⋯ W Φ_j U for j ≤ i (secant slopes, not the Jacobian's
    derivatives: they make the operator identity exact).

    Args:
        W: shape (N, N).  U: shape (N, d).  C: shape (p, N).
    """

    def __init__(self, W: Any, U: Any, C: Any, *, dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        dims = self._set_parameters(W=(W, ("N", "N")), U=(U, ("N", "d")), C=(C, ("p", "N")))
        self.d, self.p, self.N = dims["d"], dims["p"], dims["N"]

    @classmethod
    def random(cls, N: int, d: int, p: int, *, spectral_radius: float = 0.9, seed: Any = 0,
               dtype: Any = torch.float64) -> "ElmanRNN":
        """The draws of `LinearSSM.random` as (W, U, C) = (A, B, C): W Gaussian rescaled to
        `spectral_radius`; U, C with iid N(0, 1/fan-in) entries."""
        ssm = LinearSSM.random(N, d, p, spectral_radius=spectral_radius, seed=seed)
        return cls(ssm.A, ssm.B, ssm.C, dtype=dtype)

    W = exposed("W")
    U = exposed("U")
    C = exposed("C")

    def _pre_activations(self, X: torch.Tensor) -> torch.Tensor:
        # z_i = W s_{i−1} + U x_i for every i: (b, n, N).
        s, z = X.new_zeros(X.shape[0], self.N), []
        for x in (X @ self._U.T).unbind(1):
            z.append(s @ self._W.T + x)
            s = torch.tanh(z[-1])
        return torch.stack(z, 1)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self._pre_activations(X)) @ self._C.T

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        D = _tanh_secant(self._pre_activations(X))  # (b, n, N): diagonals of Φ_i
        j = torch.arange(n)[:, None, None]
        P, rows = X.new_zeros(b, n, self.N, self.d), []  # P[:, j] = Φ_i W ⋯ Φ_j U, 0 for j > i
        for i in range(n):
            carried = D[:, i, None, :, None] * (self._W @ P)
            fresh = (D[:, i, :, None] * self._U)[:, None]
            P = torch.where(j < i, carried, torch.where(j == i, fresh, torch.zeros((), dtype=X.dtype)))
            rows.append(self._C @ P)
        return torch.stack(rows, 1)

    def _sizes(self) -> dict[str, int]:
        return {"N": self.N, **super()._sizes()}
