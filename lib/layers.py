"""Position-wise layers and the causal convolution.

Dense, FeedForward and KANLayer act on each token separately, so their operators are block
diagonal in positions (𝒲_ij = 0 for i ≠ j); CausalConv1d mixes a fixed window of past
tokens, so its operator is block Toeplitz with finite support. All are bias-free: a bias
makes a map affine (homogeneous coordinates x ↦ (x, 1) absorb it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import as_real_tensor, check_int, check_real, check_shape, resolve_dtype, to_output
from .base import SequenceMap, exposed
from .operators import _block_diagonal, _toeplitz


class Dense(SequenceMap):
    """y_i = W x_i; implements {prf:ref}`prop-dense`: 𝒲_ij = δ_ij W.

    Args:
        W: weight, shape (p, d).
    """

    def __init__(self, W: Any, *, dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        dims = self._set_parameters(W=(W, ("p", "d")))
        self.d, self.p = dims["d"], dims["p"]

    @classmethod
    def random(cls, d: int, p: int, *, seed: Any = 0, dtype: Any = torch.float64) -> "Dense":
        """W with iid N(0, 1/d) entries."""
        d, p = check_int(d, "d"), check_int(p, "p")
        return cls(np.random.default_rng(seed).standard_normal((p, d)) / np.sqrt(d), dtype=dtype)

    W = exposed("W")

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        return X @ self._W.T

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        return _block_diagonal(self._W.expand(*X.shape[:2], self.p, self.d))


class FeedForward(SequenceMap):
    """y_i = W2 relu(W1 x_i); implements {prf:ref}`prop-ffn`: 𝒲_ii(X) = W2 Π(x_i) W1.

    Π(x) = diag(1[W1 x > 0]) is the activation pattern; 𝒲_ij = 0 for i ≠ j.

    Args:
        W1: shape (m, d).  W2: shape (p, m).
    """

    def __init__(self, W1: Any, W2: Any, *, dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        dims = self._set_parameters(W1=(W1, ("m", "d")), W2=(W2, ("p", "m")))
        self.d, self.p, self.m = dims["d"], dims["p"], dims["m"]

    @classmethod
    def random(cls, d: int, p: int, m: int = 16, *, seed: Any = 0, dtype: Any = torch.float64) -> "FeedForward":
        """W1 with iid N(0, 1/d) entries, W2 with iid N(0, 2/m) entries (He scaling)."""
        d, p, m = check_int(d, "d"), check_int(p, "p"), check_int(m, "m")
        rng = np.random.default_rng(seed)
        W1 = rng.standard_normal((m, d)) / np.sqrt(d)
        return cls(W1, rng.standard_normal((p, m)) * np.sqrt(2.0 / m), dtype=dtype)

    W1 = exposed("W1")
    W2 = exposed("W2")

    def activation_pattern(self, X: Any) -> torch.Tensor | np.ndarray:
        """The diagonals of Π(x_i), 1[W1 x_i > 0], shape (n, m) or (b, n, m)."""
        return self._at_edge(self._pattern, X)

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
    """y_i = Σ_{ℓ<r} K_ℓ x_{i−ℓ} (x before the start = 0); implements {prf:ref}`prop-conv`.

    𝒲_ij = K_{i−j} for 0 ≤ i−j < r, else 0. The forward pass is ``F.conv1d`` with left
    padding (a cross-correlation, hence the flipped kernel).

    Args:
        K: taps, shape (r, p, d); K_0 acts on the current token.
    """

    def __init__(self, K: Any, *, dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        dims = self._set_parameters(K=(K, ("r", "p", "d")))
        self.d, self.p, self.r = dims["d"], dims["p"], dims["r"]

    @classmethod
    def random(cls, d: int, p: int, r: int = 3, *, seed: Any = 0, dtype: Any = torch.float64) -> "CausalConv1d":
        """Taps with iid N(0, 1/(r d)) entries."""
        d, p, r = check_int(d, "d"), check_int(p, "p"), check_int(r, "r")
        return cls(np.random.default_rng(seed).standard_normal((r, p, d)) / np.sqrt(r * d), dtype=dtype)

    kernel = exposed("K", "Taps K_0..K_{r−1}, shape (r, p, d).")

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        signal = F.pad(X.transpose(1, 2), (self.r - 1, 0))
        return F.conv1d(signal, self._K.flip(0).permute(1, 2, 0)).transpose(1, 2)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        return _toeplitz(self._K, n).expand(b, n, n, self.p, self.d)

    def _sizes(self) -> dict[str, int]:
        return {"r": self.r, **super()._sizes()}


class KANLayer(SequenceMap):
    """y_i[q] = Σ_q' φ_qq'(x_i[q']) with φ_qq'(u) = w_qq' silu(u) + Σ_g c_qq'g (B_g(u) − B_g(0)).

    Implements {prf:ref}`prop-kan`: 𝒲_ii(X)[q, q'] = φ_qq'(x_i[q']) / x_i[q'], 𝒲_ij = 0 for
    i ≠ j; where x_i[q'] is within 1e-6 of 0 the spline part of φ and of its secant is its
    Taylor series at 0. B_g are cubic B-splines on a uniform grid, as in Liu et al. (2024).
    Deviation: subtracting B_g(0) makes φ(0) = 0 (the original allows a constant, i.e. a bias).

    Args:
        silu_weights: w, shape (p, d).
        spline_coefficients: c, shape (p, d, G + 3) for a grid of G intervals.
        grid_range: (lo, hi), split into G intervals; splines vanish outside lo − 3h, hi + 3h.
    """

    _SMALL = 1e-6  # below this |u| the spline part comes from its Taylor series at 0

    def __init__(self, silu_weights: Any, spline_coefficients: Any, *,
                 grid_range: tuple[float, float] = (-1.0, 1.0), dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        dims = self._set_parameters(silu_weights=(silu_weights, ("p", "d")),
                                    spline_coefficients=(spline_coefficients, ("p", "d", "M")))
        if dims["M"] < 4:
            raise ValueError("spline_coefficients must have shape (p, d, G + 3) with G >= 1; "
                             f"got {tuple(self._spline_coefficients.shape)}")
        if not isinstance(grid_range, (tuple, list)) or len(grid_range) != 2:
            raise TypeError(f"grid_range must be a pair (lo, hi); got {grid_range!r}")
        lo, hi = check_real(grid_range[0], "grid_range[0]"), check_real(grid_range[1], "grid_range[1]")
        if not lo < hi:
            raise ValueError(f"grid_range must satisfy lo < hi; got {grid_range!r}")
        self.d, self.p, self.grid_size, self.grid_range = dims["d"], dims["p"], dims["M"] - 3, (lo, hi)
        self._h = (hi - lo) / self.grid_size
        knots = lo + self._h * (torch.arange(self.grid_size + 7, dtype=self.dtype) - 3)
        self.register_buffer("_knots", knots, persistent=False)
        # B_g(0) and the Taylor coefficients B_g^(k)(0)/k!, k = 1, 2, 3, from the lower degrees. The
        # third derivative jumps where 0 is a knot: its left value comes from the left-continuous
        # degree-0 bases (t_k < 0 <= t_{k+1}), the right one from the right-continuous ones.
        B0, B1, B2, B3 = (B[0] for B in self._bases(torch.zeros(1, dtype=self.dtype)))
        B0_left = ((knots[:-1] < 0) & (0 <= knots[1:])).to(self.dtype)
        h = self._h
        third = [(B[:-3] - 3 * B[1:-2] + 3 * B[2:-1] - B[3:]) / (6 * h ** 3) for B in (B0, B0_left)]
        taylor = torch.stack([(B2[:-1] - B2[1:]) / h, (B1[:-2] - 2 * B1[1:-1] + B1[2:]) / (2 * h ** 2),
                              *third])
        self.register_buffer("_B_at_0", B3, persistent=False)
        self.register_buffer("_B_taylor_at_0", taylor, persistent=False)

    @classmethod
    def random(cls, d: int, p: int, grid_size: int = 5, *, grid_range: tuple[float, float] = (-1.0, 1.0),
               seed: Any = 0, dtype: Any = torch.float64) -> "KANLayer":
        """w and c with iid N(0, 1/d) entries."""
        d, p, grid_size = check_int(d, "d"), check_int(p, "p"), check_int(grid_size, "grid_size")
        rng = np.random.default_rng(seed)
        w = rng.standard_normal((p, d)) / np.sqrt(d)
        return cls(w, rng.standard_normal((p, d, grid_size + 3)) / np.sqrt(d), grid_range=grid_range,
                   dtype=dtype)

    silu_weights = exposed("silu_weights")
    spline_coefficients = exposed("spline_coefficients")

    def edge_functions(self, u: Any) -> torch.Tensor | np.ndarray:
        """φ_qq'(u_s) at [s, q, q'] for points u of shape (k,); shape (k, p, d)."""
        u, was_torch = as_real_tensor(u, "u", dtype=self.dtype)
        check_shape(u, "u", ("k",))
        B = self._bases(u)[-1]
        spline = torch.einsum("qrm,km->kqr", self._spline_coefficients, B - self._B_at_0)
        return to_output(self._silu_weights * F.silu(u)[:, None, None] + spline, was_torch)

    def _bases(self, u: torch.Tensor) -> list[torch.Tensor]:
        # Cox–de Boor on the uniform knots: bases of degree 0..3, shapes (..., G+6) .. (..., G+3).
        t, u = self._knots, u[..., None]
        B = ((u >= t[:-1]) & (u < t[1:])).to(u.dtype)
        degrees = [B]
        for q in (1, 2, 3):
            B = ((u - t[: -q - 1]) * B[..., :-1] + (t[q + 1:] - u) * B[..., 1:]) / (q * self._h)
            degrees.append(B)
        return degrees

    def _spline_part(self, X: torch.Tensor) -> torch.Tensor:
        # Σ_m c_qrm (B_m(x[r]) − B_m(0)) at [b, i, q, r]. Below _SMALL the difference loses its digits
        # to cancellation; near 0 the spline is one cubic, so its Taylor series is exact there.
        B = self._bases(X)[-1]
        direct = torch.einsum("qrm,birm->biqr", self._spline_coefficients, B - self._B_at_0)
        x = X[:, :, None, :]
        return torch.where(x.abs() < self._SMALL, self._spline_secant_near_0(x) * x, direct)

    def _spline_secant_near_0(self, x: torch.Tensor) -> torch.Tensor:
        # (spline(x) − spline(0)) / x = s1 + s2 x + s3 x², exactly, for x in the cubic piece on x's
        # side of 0 (s3 from the right for x >= 0, from the left for x < 0).
        s1, s2, right, left = (self._spline_coefficients @ coefficient for coefficient in self._B_taylor_at_0)
        return s1 + (s2 + torch.where(x < 0, left, right) * x) * x

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        return F.silu(X) @ self._silu_weights.T + self._spline_part(X).sum(-1)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        x = X[:, :, None, :]
        small = x.abs() < self._SMALL
        safe = torch.where(small, torch.ones((), dtype=X.dtype), x)
        spline_secant = torch.where(small, self._spline_secant_near_0(x), self._spline_part(X) / safe)
        # silu(u)/u = sigmoid(u) exactly, also at u = 0.
        return _block_diagonal(self._silu_weights * torch.sigmoid(X)[:, :, None, :] + spline_secant)

    def _sizes(self) -> dict[str, int]:
        return {"grid_size": self.grid_size, **super()._sizes()}
