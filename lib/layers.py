"""Position-wise layers and the causal convolution.

Dense, FeedForward and KANLayer act on each token separately, so their operators
are block diagonal in positions (𝒲_ij = 0 for i ≠ j); CausalConv1d mixes a fixed
window of past tokens, so its operator is block Toeplitz with finite support.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import as_parameter, as_real_tensor, check_int, check_real, check_shape, resolve_dtype, to_output
from .base import SequenceMap, _to_numpy
from .operators import _block_diagonal, _toeplitz

__all__ = ["Dense", "FeedForward", "CausalConv1d", "KANLayer"]


class Dense(SequenceMap):
    """A bias-free dense layer applied to every token: y_i = W x_i.

    Implements {prf:ref}`prop-dense`: 𝒲_ij = δ_ij W, the same block on the diagonal
    for every input.  Deviation: no bias (a bias makes the map affine; homogeneous
    coordinates x ↦ (x, 1) absorb it).

    Args:
        W: weight, shape (p, d).
        dtype: computation dtype (default float64).
    """

    def __init__(self, W: Any, *, dtype: Any = torch.float64) -> None:
        dtype = resolve_dtype(dtype)
        dims: dict[str, int] = {}
        self._W = as_parameter(W, "W", ("p", "d"), dims, dtype=dtype)
        super().__init__(dims["d"], dims["p"], dtype)

    @classmethod
    def random(cls, d: int, p: int, *, seed: Any = 0, dtype: Any = torch.float64) -> "Dense":
        """W with iid N(0, 1/d) entries."""
        d, p = check_int(d, "d"), check_int(p, "p")
        rng = np.random.default_rng(seed)
        return cls(rng.standard_normal((p, d)) / np.sqrt(d), dtype=dtype)

    @property
    def W(self) -> np.ndarray:
        """Weight, shape (p, d)."""
        return _to_numpy(self._W)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        return X @ self._W.T

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        return _block_diagonal(self._W.expand(b, n, self.p, self.d))


class FeedForward(SequenceMap):
    """A bias-free two-layer ReLU network applied to every token: y_i = W2 relu(W1 x_i).

    Implements {prf:ref}`prop-ffn`: 𝒲_ii(X) = W2 D_i W1 with the activation pattern
    D_i = diag(1[W1 x_i > 0]) and 𝒲_ij = 0 for i ≠ j.  The operator depends on X
    only through the activation patterns.  Deviation: no biases (see Dense).

    Args:
        W1: first weight, shape (m, d).
        W2: second weight, shape (p, m).
        dtype: computation dtype (default float64).
    """

    def __init__(self, W1: Any, W2: Any, *, dtype: Any = torch.float64) -> None:
        dtype = resolve_dtype(dtype)
        dims: dict[str, int] = {}
        self._W1 = as_parameter(W1, "W1", ("m", "d"), dims, dtype=dtype)
        self._W2 = as_parameter(W2, "W2", ("p", "m"), dims, dtype=dtype)
        self.m = dims["m"]
        super().__init__(dims["d"], dims["p"], dtype)

    @classmethod
    def random(cls, d: int, p: int, m: int = 16, *, seed: Any = 0, dtype: Any = torch.float64) -> "FeedForward":
        """W1 with iid N(0, 1/d) entries, W2 with iid N(0, 2/m) entries (He scaling)."""
        d, p, m = check_int(d, "d"), check_int(p, "p"), check_int(m, "m")
        rng = np.random.default_rng(seed)
        W1 = rng.standard_normal((m, d)) / np.sqrt(d)
        W2 = rng.standard_normal((p, m)) * np.sqrt(2.0 / m)
        return cls(W1, W2, dtype=dtype)

    @property
    def W1(self) -> np.ndarray:
        """First weight, shape (m, d)."""
        return _to_numpy(self._W1)

    @property
    def W2(self) -> np.ndarray:
        """Second weight, shape (p, m)."""
        return _to_numpy(self._W2)

    def activation_pattern(self, X: Any) -> torch.Tensor | np.ndarray:
        """The diagonals of D_i: 1[W1 x_i > 0] as booleans, shape (n, m) or (b, n, m)."""
        return self._apply(self._pattern, X)

    def _pattern(self, X: torch.Tensor) -> torch.Tensor:
        return X @ self._W1.T > 0

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        return torch.relu(X @ self._W1.T) @ self._W2.T

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        D = self._pattern(X).to(self.dtype)
        return _block_diagonal(torch.einsum("pm,bim,md->bipd", self._W2, D, self._W1))

    def _sizes(self) -> dict[str, int]:
        return {"m": self.m, **super()._sizes()}


class CausalConv1d(SequenceMap):
    """A causal convolution with r taps: y_i = Σ_{ℓ=0}^{r−1} K_ℓ x_{i−ℓ} (x_{i−ℓ} = 0 for i−ℓ < 0).

    Implements {prf:ref}`prop-conv`: 𝒲_ij = K_{i−j} for 0 ≤ i−j < r and 0 otherwise,
    a block-Toeplitz operator that does not depend on X.  The forward pass is
    torch.nn.functional.conv1d with left padding r − 1 (a cross-correlation, hence
    the flipped kernel); no bias.

    Args:
        K: taps K_0..K_{r−1}, shape (r, p, d); K_0 acts on the current token.
        dtype: computation dtype (default float64).
    """

    def __init__(self, K: Any, *, dtype: Any = torch.float64) -> None:
        dtype = resolve_dtype(dtype)
        dims: dict[str, int] = {}
        self._K = as_parameter(K, "K", ("r", "p", "d"), dims, dtype=dtype)
        self.r = dims["r"]
        super().__init__(dims["d"], dims["p"], dtype)

    @classmethod
    def random(cls, d: int, p: int, r: int = 3, *, seed: Any = 0, dtype: Any = torch.float64) -> "CausalConv1d":
        """Taps with iid N(0, 1/(r d)) entries."""
        d, p, r = check_int(d, "d"), check_int(p, "p"), check_int(r, "r")
        rng = np.random.default_rng(seed)
        return cls(rng.standard_normal((r, p, d)) / np.sqrt(r * d), dtype=dtype)

    @property
    def kernel(self) -> np.ndarray:
        """Taps K_0..K_{r−1}, shape (r, p, d)."""
        return _to_numpy(self._K)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        weight = self._K.flip(0).permute(1, 2, 0)  # (p, d, r); conv1d correlates
        signal = F.pad(X.transpose(1, 2), (self.r - 1, 0))
        return F.conv1d(signal, weight).transpose(1, 2)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        return _toeplitz(self._K, n).expand(b, n, n, self.p, self.d)

    def _sizes(self) -> dict[str, int]:
        return {"r": self.r, **super()._sizes()}


class KANLayer(SequenceMap):
    """A Kolmogorov–Arnold layer applied to every token: y_i[q] = Σ_r φ_{q,r}(x_i[r]).

    Each edge function is a SiLU term plus a cubic B-spline on a uniform grid,

        φ_{q,r}(u) = w_{q,r} silu(u) + Σ_m c_{q,r,m} (B_m(u) − B_m(0)),

    as in Liu et al. (2024).  Implements {prf:ref}`prop-kan`:
    𝒲_ii(X)[q, r] = φ_{q,r}(x_i[r]) / x_i[r] (the secant slope; φ'_{q,r}(0) where
    |x_i[r]| < 1e-6) and 𝒲_ij = 0 for i ≠ j — block diagonal, input-dependent.

    Deviation: subtracting B_m(0) makes φ(0) = 0, so the layer is homogeneous; the
    original KAN allows φ(0) ≠ 0, which is a constant (a bias).

    Args:
        silu_weights: w, shape (p, d).
        spline_coefficients: c, shape (p, d, G + 3) for a grid of G intervals.
        grid_range: (lo, hi), the interval split into G equal intervals; the splines
            vanish outside [lo − 3h, hi + 3h] with h = (hi − lo)/G.
        dtype: computation dtype (default float64).
    """

    _SMALL = 1e-6  # below this |u| the secant slope is replaced by φ'(0)

    def __init__(self, silu_weights: Any, spline_coefficients: Any, *, grid_range: tuple[float, float] = (-1.0, 1.0),
                 dtype: Any = torch.float64) -> None:
        dtype = resolve_dtype(dtype)
        dims: dict[str, int] = {}
        self._w = as_parameter(silu_weights, "silu_weights", ("p", "d"), dims, dtype=dtype)
        self._c = as_parameter(spline_coefficients, "spline_coefficients", ("p", "d", "M"), dims, dtype=dtype)
        if dims["M"] < 4:
            raise ValueError("spline_coefficients must have shape (p, d, G + 3) with G >= 1; "
                             f"got {tuple(self._c.shape)}")
        if not isinstance(grid_range, (tuple, list)) or len(grid_range) != 2:
            raise TypeError(f"grid_range must be a pair (lo, hi); got {grid_range!r}")
        lo, hi = check_real(grid_range[0], "grid_range[0]"), check_real(grid_range[1], "grid_range[1]")
        if not lo < hi:
            raise ValueError(f"grid_range must satisfy lo < hi; got {grid_range!r}")
        self.grid_size = dims["M"] - 3
        self.grid_range = (lo, hi)
        self._h = (hi - lo) / self.grid_size
        self._knots = lo + self._h * (torch.arange(self.grid_size + 7, dtype=dtype) - 3)
        super().__init__(dims["d"], dims["p"], dtype)
        zero = torch.zeros(1, dtype=dtype)
        B2_at_0, self._B_at_0 = self._bases(zero)
        self._B_slope_at_0 = (B2_at_0[..., :-1] - B2_at_0[..., 1:])[0] / self._h  # B'_m(0), shape (M,)
        self._B_at_0 = self._B_at_0[0]

    @classmethod
    def random(cls, d: int, p: int, grid_size: int = 5, *, grid_range: tuple[float, float] = (-1.0, 1.0),
               seed: Any = 0, dtype: Any = torch.float64) -> "KANLayer":
        """w with iid N(0, 1/d) entries and spline coefficients with iid N(0, 1/d) entries."""
        d, p, grid_size = check_int(d, "d"), check_int(p, "p"), check_int(grid_size, "grid_size")
        rng = np.random.default_rng(seed)
        w = rng.standard_normal((p, d)) / np.sqrt(d)
        c = rng.standard_normal((p, d, grid_size + 3)) / np.sqrt(d)
        return cls(w, c, grid_range=grid_range, dtype=dtype)

    @property
    def silu_weights(self) -> np.ndarray:
        """w, shape (p, d)."""
        return _to_numpy(self._w)

    @property
    def spline_coefficients(self) -> np.ndarray:
        """c, shape (p, d, G + 3)."""
        return _to_numpy(self._c)

    def edge_functions(self, u: Any) -> torch.Tensor | np.ndarray:
        """The edge functions φ_{q,r} evaluated on a 1-D grid u (for plots).

        Args:
            u: points, shape (k,).

        Returns:
            φ_{q,r}(u_s) at [s, q, r], shape (k, p, d).
        """
        u, was_torch = as_real_tensor(u, "u", dtype=self.dtype)
        check_shape(u, "u", ("k",))
        _, B = self._bases(u)
        phi = self._w * F.silu(u)[:, None, None] + torch.einsum("qrm,km->kqr", self._c, B - self._B_at_0)
        return to_output(phi, was_torch)

    def _bases(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Cox–de Boor on the uniform knots: (quadratic bases (..., G+4), cubic bases (..., G+3)).
        t = self._knots
        u = u[..., None]
        B = ((u >= t[:-1]) & (u < t[1:])).to(u.dtype)
        for q in (1, 2, 3):
            quadratic = B
            B = ((u - t[: -q - 1]) * B[..., :-1] + (t[q + 1:] - u) * B[..., 1:]) / (q * self._h)
        return quadratic, B

    def _spline_part(self, X: torch.Tensor) -> torch.Tensor:
        # Σ_m c_{q,r,m} (B_m(x[r]) − B_m(0)) at [b, i, q, r].
        _, B = self._bases(X)
        return torch.einsum("qrm,birm->biqr", self._c, B - self._B_at_0)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        return F.silu(X) @ self._w.T + self._spline_part(X).sum(-1)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        small = X.abs() < self._SMALL
        safe = torch.where(small, torch.ones((), dtype=X.dtype), X)[:, :, None, :]
        spline_secant = torch.where(small[:, :, None, :], self._c @ self._B_slope_at_0, self._spline_part(X) / safe)
        # silu(u)/u = sigmoid(u) exactly, also at u = 0.
        blocks = self._w * torch.sigmoid(X)[:, :, None, :] + spline_secant
        return _block_diagonal(blocks)

    def _sizes(self) -> dict[str, int]:
        return {"grid_size": self.grid_size, **super()._sizes()}
