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
from ._validation import check_int, check_real, resolve_dtype
from .base import SequenceMap, exposed
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

    The input-independent case of {prf:ref}`def-factorized` (α^h_ij = c[h, i−j] for
    0 ≤ i−j < n_max), the model class of {prf:ref}`thm-head-count`; coefficients are signed
    and unnormalised. The forward pass y_i = Σ_h Σ_ℓ c[h, ℓ] V_h x_{i−ℓ} is a direct Toeplitz
    product for n <= 512 and an FFT convolution beyond (causal up to ~1e-16 rounding).

    Args:
        V: value maps, shape (H, p, d); H = 0 gives the zero map.
        coefficients: c, shape (H, n_max); longer sequences are rejected.
    """

    _DIRECT_UP_TO = 512

    def __init__(self, V: Any, coefficients: Any, *, dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        dims = self._set_parameters(may_be_empty=("H",), V=(V, ("H", "p", "d")),
                                    coefficients=(coefficients, ("H", "n_max")))
        self.d, self.p, self.H, self.max_length = dims["d"], dims["p"], dims["H"], dims["n_max"]

    @classmethod
    def random(cls, H: int, n_max: int, d: int, p: int, *, decay: float = 0.9, scale: float = 1.0,
               seed: Any = 0, dtype: Any = torch.float64) -> "RelativeHeads":
        """V with iid N(0, 1/d) entries; c[h, ℓ] = scale · decay^ℓ · N(0, 1)."""
        H, n_max, d, p = check_int(H, "H"), check_int(n_max, "n_max"), check_int(d, "d"), check_int(p, "p")
        decay, scale = check_real(decay, "decay"), check_real(scale, "scale", nonnegative=True)
        rng = np.random.default_rng(seed)
        V = rng.standard_normal((H, p, d)) / np.sqrt(d)
        return cls(V, scale * rng.standard_normal((H, n_max)) * decay ** np.arange(n_max), dtype=dtype)

    V = exposed("V")
    coefficients = exposed("coefficients", "c, shape (H, n_max).")

    def values(self) -> np.ndarray:
        """V_h, shape (H, p, d) (the factorized-class interface)."""
        return self.V

    def _lags(self, n: int) -> torch.Tensor:
        # L̂_ℓ = Σ_h c[h, ℓ] V_h, shape (n, p, d).
        return torch.einsum("hl,hpd->lpd", self._coefficients[:, :n], self._V)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        if self.H == 0:
            return X.new_zeros(*X.shape[:2], self.p)
        projected, n = torch.einsum("hpd,bnd->bnhp", self._V, X), X.shape[1]  # V_h x_j
        if n > self._DIRECT_UP_TO:
            return fft_causal_conv(projected, self._coefficients.T, "fh,bfhp->bfp")
        return torch.einsum("ijh,bjhp->bip", _toeplitz(self._coefficients.T, n), projected)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        alpha = _toeplitz(self._coefficients.T, n).permute(2, 0, 1)  # (H, n, n)
        return factorized_operator(alpha.expand(b, -1, -1, -1), self._V)

    def _sizes(self) -> dict[str, int]:
        return {"H": self.H, "n_max": self.max_length, **super()._sizes()}
