"""Position-wise layers and the causal convolution, bias-free.

Dense, FeedForward and KANLayer act on each token alone: their operators are block diagonal
(𝒲_ij = 0 for i ≠ j). CausalConv1d mixes a window of r past tokens: block Toeplitz. A bias
would make a map affine (the homogeneous coordinate x ↦ (x, 1) absorbs it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import as_generator, check_int, check_real
from .base import SequenceMap, batched
from .operators import toeplitz_operator


def _block_diagonal(blocks: torch.Tensor) -> torch.Tensor:
    # blocks (b, n, p, d) -> W (b, n, n, p, d) with W[:, i, i] = blocks[:, i].
    eye = torch.eye(blocks.shape[1], dtype=blocks.dtype, device=blocks.device)
    return torch.einsum("ij,bipd->bijpd", eye, blocks)


def _gaussian(seed: Any, shape: tuple[int, ...], scale: float) -> np.ndarray:
    return as_generator(seed).standard_normal(shape) * scale


class Dense(SequenceMap):
    """y_i = W x_i, W (p, d); {prf:ref}`prop-dense`: 𝒲_ij = δ_ij W."""

    def __init__(self, W: Any, *, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, W=(W, "p d"))
        self.d, self.p = dims["d"], dims["p"]

    @classmethod
    def random(cls, d: int, p: int, *, seed: Any = 0, dtype: torch.dtype = torch.float64) -> "Dense":
        """W with iid N(0, 1/d) entries."""
        d, p = check_int(d, "d"), check_int(p, "p")
        return cls(_gaussian(seed, (p, d), 1 / np.sqrt(d)), dtype=dtype)

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return X @ self.W.T

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        return _block_diagonal(self.W.expand(*X.shape[:2], self.p, self.d))


class FeedForward(SequenceMap):
    """y_i = W2 relu(W1 x_i), W1 (m, d), W2 (p, m); {prf:ref}`prop-ffn`: 𝒲_ii(X) = W2 Π(x_i) W1.

    Π(x) = diag(1[W1 x > 0]), the activation pattern; 𝒲_ij = 0 for i ≠ j.
    """

    def __init__(self, W1: Any, W2: Any, *, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, W1=(W1, "m d"), W2=(W2, "p m"))
        self.d, self.p, self.m = dims["d"], dims["p"], dims["m"]

    @classmethod
    def random(cls, d: int, p: int, m: int = 16, *, seed: Any = 0,
               dtype: torch.dtype = torch.float64) -> "FeedForward":
        """W1 with iid N(0, 1/d) entries, W2 with iid N(0, 2/m) (He scaling)."""
        d, p, m = check_int(d, "d"), check_int(p, "p"), check_int(m, "m")
        rng = as_generator(seed)
        W1 = rng.standard_normal((m, d)) / np.sqrt(d)
        return cls(W1, rng.standard_normal((p, m)) * np.sqrt(2.0 / m), dtype=dtype)

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return torch.relu(X @ self.W1.T) @ self.W2.T

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        pattern = (X @ self.W1.T > 0).to(X.dtype)
        return _block_diagonal(torch.einsum("pm,bim,md->bipd", self.W2, pattern, self.W1))


class CausalConv1d(SequenceMap):
    """y_i = Σ_{ℓ<r} K_ℓ x_{i−ℓ} (x = 0 before the start), K (r, p, d); {prf:ref}`prop-conv`.

    𝒲_ij = K_{i−j} for 0 <= i − j < r. Computed by ``F.conv1d`` (a cross-correlation, hence the
    flipped taps) with left padding.
    """

    def __init__(self, K: Any, *, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, K=(K, "r p d"))
        self.d, self.p, self.r = dims["d"], dims["p"], dims["r"]

    @classmethod
    def random(cls, d: int, p: int, r: int = 3, *, seed: Any = 0,
               dtype: torch.dtype = torch.float64) -> "CausalConv1d":
        """Taps with iid N(0, 1/(r d)) entries."""
        d, p, r = check_int(d, "d"), check_int(p, "p"), check_int(r, "r")
        return cls(_gaussian(seed, (r, p, d), 1 / np.sqrt(r * d)), dtype=dtype)

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        signal = F.pad(X.transpose(1, 2), (self.r - 1, 0))
        return F.conv1d(signal, self.K.flip(0).permute(1, 2, 0)).transpose(1, 2)

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        return toeplitz_operator(self.K, n).expand(b, n, n, self.p, self.d)


class KANLayer(SequenceMap):
    """y_i[q] = Σ_q' φ_qq'(x_i[q']), φ_qq'(u) = w_qq' silu(u) + Σ_g c_qq'g (B_g(u) − B_g(0)).

    {prf:ref}`prop-kan`: 𝒲_ii(X)[q, q'] = φ_qq'(x_i[q'])/x_i[q'] (secant slopes), 𝒲_ij = 0 for
    i ≠ j; within 1e-6 of 0 the spline's secant is its exact Taylor cubic. B_g: cubic B-splines
    on G uniform intervals of grid_range (Liu et al. 2024). Deviation: − B_g(0) makes φ(0) = 0
    (the original allows a constant, i.e. a bias).
    Parameters: silu_weights w (p, d), spline_coefficients c (p, d, G + 3).
    """

    _SMALL = 1e-6

    def __init__(self, silu_weights: Any, spline_coefficients: Any, *,
                 grid_range: tuple[float, float] = (-1.0, 1.0), dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, silu_weights=(silu_weights, "p d"),
                                   spline_coefficients=(spline_coefficients, "p d M"))
        if dims["M"] < 4:
            raise ValueError(f"spline_coefficients must have shape (p, d, G + 3) with G >= 1; got M = {dims['M']}")
        if not isinstance(grid_range, (tuple, list)) or len(grid_range) != 2:
            raise TypeError(f"grid_range must be a pair (lo, hi); got {grid_range!r}")
        lo = check_real(grid_range[0], "grid_range[0]")
        hi = check_real(grid_range[1], "grid_range[1]", low=lo, open_interval=True)
        self.d, self.p, self.grid_size, self.grid_range = dims["d"], dims["p"], dims["M"] - 3, (lo, hi)
        self._h = h = (hi - lo) / self.grid_size
        knots = lo + h * (torch.arange(self.grid_size + 7, dtype=dtype) - 3)
        self.register_buffer("knots", knots, persistent=False)
        # B_g(0) and the Taylor coefficients B_g^(k)(0)/k!, k = 1, 2, 3, from the lower degrees.
        # The third derivative jumps where 0 is a knot: its left value comes from the
        # left-continuous degree-0 bases (t_k < 0 <= t_{k+1}), the right one from the usual ones.
        B0, B1, B2, B3 = (B[0] for B in self._bases(torch.zeros(1, dtype=dtype)))
        B0_left = ((knots[:-1] < 0) & (0 <= knots[1:])).to(dtype)
        third = [(B[:-3] - 3 * B[1:-2] + 3 * B[2:-1] - B[3:]) / (6 * h ** 3) for B in (B0, B0_left)]
        taylor = torch.stack([(B2[:-1] - B2[1:]) / h, (B1[:-2] - 2 * B1[1:-1] + B1[2:]) / (2 * h ** 2), *third])
        self.register_buffer("bases_at_0", B3, persistent=False)
        self.register_buffer("taylor_at_0", taylor, persistent=False)

    @classmethod
    def random(cls, d: int, p: int, grid_size: int = 5, *, grid_range: tuple[float, float] = (-1.0, 1.0),
               seed: Any = 0, dtype: torch.dtype = torch.float64) -> "KANLayer":
        """w and c with iid N(0, 1/d) entries."""
        d, p, grid_size = check_int(d, "d"), check_int(p, "p"), check_int(grid_size, "grid_size")
        rng = as_generator(seed)
        w = rng.standard_normal((p, d)) / np.sqrt(d)
        c = rng.standard_normal((p, d, grid_size + 3)) / np.sqrt(d)
        return cls(w, c, grid_range=grid_range, dtype=dtype)

    def _bases(self, u: torch.Tensor) -> list[torch.Tensor]:
        # Cox–de Boor on the uniform knots: bases of degree 0..3, shapes (..., G+6) .. (..., G+3).
        t, u = self.knots, u[..., None]
        B = ((u >= t[:-1]) & (u < t[1:])).to(u.dtype)
        degrees = [B]
        for q in (1, 2, 3):
            B = ((u - t[: -q - 1]) * B[..., :-1] + (t[q + 1:] - u) * B[..., 1:]) / (q * self._h)
            degrees.append(B)
        return degrees

    def _secant_near_0(self, x: torch.Tensor) -> torch.Tensor:
        # (spline(x) − spline(0))/x = s1 + s2 x + s3 x², exact on the cubic piece on x's side of 0.
        s1, s2, right, left = (self.spline_coefficients @ t for t in self.taylor_at_0)
        return s1 + (s2 + torch.where(x < 0, left, right) * x) * x

    def _spline_part(self, X: torch.Tensor) -> torch.Tensor:
        # Σ_m c_qrm (B_m(x[r]) − B_m(0)) at [b, i, q, r]; near 0 from the Taylor cubic (no cancellation).
        B = self._bases(X)[-1]
        direct = torch.einsum("qrm,birm->biqr", self.spline_coefficients, B - self.bases_at_0)
        x = X[:, :, None, :]
        return torch.where(x.abs() < self._SMALL, self._secant_near_0(x) * x, direct)

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return F.silu(X) @ self.silu_weights.T + self._spline_part(X).sum(-1)

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        x = X[:, :, None, :]
        small = x.abs() < self._SMALL
        safe = torch.where(small, torch.ones((), dtype=X.dtype), x)
        secant = torch.where(small, self._secant_near_0(x), self._spline_part(X) / safe)
        # silu(u)/u = sigmoid(u) exactly, also at u = 0.
        return _block_diagonal(self.silu_weights * torch.sigmoid(X)[:, :, None, :] + secant)
