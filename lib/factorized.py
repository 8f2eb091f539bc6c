"""The multi-head factorized class and its simplest member, relative-position heads.

A map is in the Unified Factorized Framework ({prf:ref}`def-factorized`) with H heads when

    𝒲_ij(X) = Σ_h α^h_ij(X) V_h,   α^h_ij(X) scalar,  V_h ∈ ℝ^{p×d} shared,

so every block lies in span{V_1..V_H} and the interaction rank is at most H.
Attention, linear attention and Mamba-2's SSD build their operators with
`factorized_operator`; RelativeHeads is the input-independent, causal case
α^h_ij = c_h[i − j] used by the head-count theorem.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._convolution import fft_causal_conv
from ._validation import as_parameter, check_int, resolve_dtype
from .base import SequenceMap, _to_numpy
from .operators import _toeplitz

__all__ = ["RelativeHeads", "factorized_operator"]


def factorized_operator(coefficients: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """𝒲_ij = Σ_h α^h_ij V_h ({prf:ref}`def-factorized`) as a torch tensor.

    Args:
        coefficients: α, shape (b, H, n, n).
        values: V, shape (H, p, d).

    Returns:
        W, shape (b, n, n, p, d).
    """
    return torch.einsum("bhij,hpd->bijpd", coefficients, values)


class RelativeHeads(SequenceMap):
    """H causal heads whose coefficients depend only on the lag: 𝒲_ij = Σ_h c[h, i−j] V_h.

    Implements the input-independent case of {prf:ref}`def-factorized`:
    α^h_ij = c[h, i−j] for 0 ≤ i−j < n_max and 0 otherwise (causal).  The
    coefficients may be signed and unnormalised — unlike softmax weights.  The
    forward pass projects the sequence with each V_h and convolves the projection
    causally with c_h, then sums over heads:

        y_i = Σ_h Σ_{ℓ=0}^{i} c[h, ℓ] V_h x_{i−ℓ}.

    The convolution is direct for n <= 512 (exactly causal) and via the FFT for
    longer sequences (O(n log n); outputs then depend on later inputs only at
    the level of rounding, ~1e-16 relative).

    Args:
        V: value maps V_1..V_H, shape (H, p, d); H = 0 gives the zero map.
        coefficients: c, shape (H, n_max); c[h, ℓ] is head h's weight at lag ℓ.
            Sequences longer than n_max are rejected (ValueError).
        dtype: computation dtype (default float64).
    """

    _DIRECT_UP_TO = 512  # longer sequences are convolved via the FFT

    def __init__(self, V: Any, coefficients: Any, *, dtype: Any = torch.float64) -> None:
        dtype = resolve_dtype(dtype)
        dims: dict[str, int] = {}
        # H = 0 is allowed: the model with no heads (𝒲 = 0), e.g. for an SSM whose lags all vanish.
        self._V = as_parameter(V, "V", ("H", "p", "d"), dims, dtype=dtype, may_be_empty=("H",))
        self._c = as_parameter(coefficients, "coefficients", ("H", "n_max"), dims, dtype=dtype,
                               may_be_empty=("H",))
        self.H = dims["H"]
        self.max_length = dims["n_max"]
        super().__init__(dims["d"], dims["p"], dtype)

    @classmethod
    def random(cls, H: int, n_max: int, d: int, p: int, *, decay: float = 0.9, seed: Any = 0,
               dtype: Any = torch.float64) -> "RelativeHeads":
        """V with iid N(0, 1/d) entries; c[h, ℓ] = decay^ℓ · N(0, 1)."""
        H, n_max, d, p = check_int(H, "H"), check_int(n_max, "n_max"), check_int(d, "d"), check_int(p, "p")
        rng = np.random.default_rng(seed)
        V = rng.standard_normal((H, p, d)) / np.sqrt(d)
        c = rng.standard_normal((H, n_max)) * float(decay) ** np.arange(n_max)
        return cls(V, c, dtype=dtype)

    @property
    def V(self) -> np.ndarray:
        """Value maps, shape (H, p, d)."""
        return _to_numpy(self._V)

    @property
    def coefficients(self) -> np.ndarray:
        """c, shape (H, n_max)."""
        return _to_numpy(self._c)

    def values(self) -> np.ndarray:
        """Value maps V_h, shape (H, p, d) (the same as `.V`; the factorized-class interface)."""
        return self.V

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        if self.H == 0:
            return X.new_zeros(*X.shape[:2], self.p)
        projected = torch.einsum("hpd,bnd->bnhp", self._V, X)  # V_h x_j
        n = X.shape[1]
        if n > self._DIRECT_UP_TO:
            return fft_causal_conv(projected, self._c.T, "fh,bfhp->bfp")
        # Direct convolution (a Toeplitz product): exactly causal, not just up to rounding.
        return torch.einsum("ijh,bjhp->bip", _toeplitz(self._c.T, n), projected)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        alpha = _toeplitz(self._c.T, n).permute(2, 0, 1)  # (H, n, n)
        return factorized_operator(alpha.expand(b, -1, -1, -1), self._V)

    def _sizes(self) -> dict[str, int]:
        return {"H": self.H, "n_max": self.max_length, **super()._sizes()}
