"""A nonlinear recurrent network and its exact interaction operator."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._validation import as_parameter, check_int, check_real, resolve_dtype
from .base import SequenceMap, _to_numpy

__all__ = ["ElmanRNN"]


def _tanh_secant(z: torch.Tensor) -> torch.Tensor:
    """tanh(z)/z, equal to 1 at z = 0; the series 1 − z²/3 where |z| < 1e-8 avoids 0/0."""
    small = z.abs() < 1e-8
    safe = torch.where(small, torch.ones((), dtype=z.dtype), z)
    return torch.where(small, 1 - z * z / 3, torch.tanh(safe) / safe)


class ElmanRNN(SequenceMap):
    """A bias-free tanh (Elman) network: s_i = tanh(W s_{i−1} + U x_i), y_i = C s_i, s_{−1} = 0.

    Implements {prf:ref}`prop-rnn`.  Writing z_i = W s_{i−1} + U x_i and the secant
    factor D_i = diag(tanh(z_i)/z_i), the recurrence is exactly s_i = D_i (W s_{i−1} + U x_i),
    so unrolling it gives

        𝒲_ij(X) = C D_i W D_{i−1} W ⋯ D_{j+1} W D_j U   for j ≤ i,   0 for j > i:

    causal, and input-dependent through the D's.  (The secant factors are not the
    Jacobian's diag(1 − tanh²z); they make the operator identity exact.)
    Deviation: no biases (see Dense).

    Args:
        W: state-to-state weight, shape (N, N).
        U: input weight, shape (N, d).
        C: readout, shape (p, N).
        dtype: computation dtype (default float64).
    """

    def __init__(self, W: Any, U: Any, C: Any, *, dtype: Any = torch.float64) -> None:
        dtype = resolve_dtype(dtype)
        dims: dict[str, int] = {}
        self._W = as_parameter(W, "W", ("N", "N"), dims, dtype=dtype)
        self._U = as_parameter(U, "U", ("N", "d"), dims, dtype=dtype)
        self._C = as_parameter(C, "C", ("p", "N"), dims, dtype=dtype)
        self.N = dims["N"]
        super().__init__(dims["d"], dims["p"], dtype)

    @classmethod
    def random(cls, N: int, d: int, p: int, *, spectral_radius: float = 0.9, seed: Any = 0,
               dtype: Any = torch.float64) -> "ElmanRNN":
        """W Gaussian rescaled to the given spectral radius; U, C with iid N(0, 1/fan-in) entries."""
        N, d, p = check_int(N, "N"), check_int(d, "d"), check_int(p, "p")
        radius = check_real(spectral_radius, "spectral_radius", nonnegative=True)
        rng = np.random.default_rng(seed)
        W = rng.standard_normal((N, N))
        W *= radius / max(np.abs(np.linalg.eigvals(W)).max(), 1e-300)
        U = rng.standard_normal((N, d)) / np.sqrt(d)
        C = rng.standard_normal((p, N)) / np.sqrt(N)
        return cls(W, U, C, dtype=dtype)

    @property
    def W(self) -> np.ndarray:
        """State-to-state weight, shape (N, N)."""
        return _to_numpy(self._W)

    @property
    def U(self) -> np.ndarray:
        """Input weight, shape (N, d)."""
        return _to_numpy(self._U)

    @property
    def C(self) -> np.ndarray:
        """Readout, shape (p, N)."""
        return _to_numpy(self._C)

    def _pre_activations(self, X: torch.Tensor) -> torch.Tensor:
        # z_i = W s_{i−1} + U x_i for every i: (b, n, N).
        s = X.new_zeros(X.shape[0], self.N)
        z = []
        for x in (X @ self._U.T).unbind(1):
            z.append(s @ self._W.T + x)
            s = torch.tanh(z[-1])
        return torch.stack(z, 1)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self._pre_activations(X)) @ self._C.T

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        D = _tanh_secant(self._pre_activations(X))  # (b, n, N): diagonals of D_i
        j = torch.arange(n)[:, None, None]
        # P[:, j] = D_i W ⋯ D_j U (N × d) for the current i; zero for j > i.
        P = X.new_zeros(b, n, self.N, self.d)
        rows = []
        for i in range(n):
            carried = D[:, i, None, :, None] * (self._W @ P)
            fresh = (D[:, i, :, None] * self._U)[:, None]
            P = torch.where(j < i, carried, torch.where(j == i, fresh, torch.zeros((), dtype=X.dtype)))
            rows.append(self._C @ P)
        return torch.stack(rows, 1)

    def _sizes(self) -> dict[str, int]:
        return {"N": self.N, **super()._sizes()}
