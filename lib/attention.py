"""Multi-head softmax attention and linear attention: the factorized class's archetypes.

Both mix tokens through per-head scalar weights α^h_ij(X) applied to shared
value maps V_h = W_O^h W_V^h ∈ ℝ^{p×d}:

    y_i = Σ_h W_O^h Σ_j α^h_ij W_V^h x_j,   so   𝒲_ij(X) = Σ_h α^h_ij(X) V_h,

which is {prf:ref}`def-factorized` with H heads.  They differ only in α.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from ._validation import as_parameter, check_int, resolve_dtype
from .base import SequenceMap, _to_numpy
from .factorized import factorized_operator

__all__ = ["SoftmaxAttention", "LinearAttention"]


class _MultiHead(SequenceMap):
    """Projections, value maps and the factorized operator shared by both attentions.

    Args:
        W_Q: queries, shape (H, d_k, d).   W_K: keys, shape (H, d_k, d).
        W_V: values, shape (H, d_v, d).    W_O: output maps, shape (H, p, d_v).
        causal: if True, token i attends only to j ≤ i.
    """

    def __init__(self, W_Q: Any, W_K: Any, W_V: Any, W_O: Any, causal: bool, dtype: Any) -> None:
        dtype = resolve_dtype(dtype)
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
        dims: dict[str, int] = {}
        self._W_Q = as_parameter(W_Q, "W_Q", ("H", "d_k", "d"), dims, dtype=dtype)
        self._W_K = as_parameter(W_K, "W_K", ("H", "d_k", "d"), dims, dtype=dtype)
        self._W_V = as_parameter(W_V, "W_V", ("H", "d_v", "d"), dims, dtype=dtype)
        self._W_O = as_parameter(W_O, "W_O", ("H", "p", "d_v"), dims, dtype=dtype)
        self.H, self.d_k, self.d_v = dims["H"], dims["d_k"], dims["d_v"]
        self.causal = causal
        super().__init__(dims["d"], dims["p"], dtype)

    @classmethod
    def _random_projections(cls, d: int, p: int, heads: int, d_k: int | None, d_v: int | None, seed: Any) -> dict:
        # W_Q, W_K, W_V with iid N(0, 1/d) entries, W_O with iid N(0, 1/(H d_v)).
        d, p, heads = check_int(d, "d"), check_int(p, "p"), check_int(heads, "heads")
        d_k = max(1, d // heads) if d_k is None else check_int(d_k, "d_k")
        d_v = max(1, d // heads) if d_v is None else check_int(d_v, "d_v")
        rng = np.random.default_rng(seed)
        return {
            "W_Q": rng.standard_normal((heads, d_k, d)) / np.sqrt(d),
            "W_K": rng.standard_normal((heads, d_k, d)) / np.sqrt(d),
            "W_V": rng.standard_normal((heads, d_v, d)) / np.sqrt(d),
            "W_O": rng.standard_normal((heads, p, d_v)) / np.sqrt(heads * d_v),
        }

    @property
    def W_Q(self) -> np.ndarray:
        """Query projections, shape (H, d_k, d)."""
        return _to_numpy(self._W_Q)

    @property
    def W_K(self) -> np.ndarray:
        """Key projections, shape (H, d_k, d)."""
        return _to_numpy(self._W_K)

    @property
    def W_V(self) -> np.ndarray:
        """Value projections, shape (H, d_v, d)."""
        return _to_numpy(self._W_V)

    @property
    def W_O(self) -> np.ndarray:
        """Output maps, shape (H, p, d_v)."""
        return _to_numpy(self._W_O)

    def values(self) -> np.ndarray:
        """The shared value maps V_h = W_O^h W_V^h, shape (H, p, d)."""
        return _to_numpy(self._values())

    def weights(self, X: Any) -> torch.Tensor | np.ndarray:
        """The attention weights α^h_ij(X), shape (H, n, n) or (b, H, n, n); zero for j > i if causal."""
        return self._apply(self._weights, X)

    def _values(self) -> torch.Tensor:
        return self._W_O @ self._W_V

    def _project(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Per-head queries, keys, values: (b, H, n, d_k), (b, H, n, d_k), (b, H, n, d_v).
        return tuple(torch.einsum("hkd,bnd->bhnk", W, X) for W in (self._W_Q, self._W_K, self._W_V))

    def _output(self, mixed: torch.Tensor) -> torch.Tensor:
        # Σ_h W_O^h (mixed values of head h): (b, H, n, d_v) -> (b, n, p).
        return torch.einsum("hpv,bhnv->bnp", self._W_O, mixed)

    def _weights(self, X: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        return factorized_operator(self._weights(X), self._values())

    def _sizes(self) -> dict[str, int]:
        return {"H": self.H, "d_k": self.d_k, "d_v": self.d_v, **super()._sizes()}

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", causal={self.causal})"


class SoftmaxAttention(_MultiHead):
    """Multi-head (optionally causal) softmax attention, bias-free projections.

    Scores and weights per head h:

        s^h_ij = (W_Q^h x_i)·(W_K^h x_j)/√d_k + b_h[i−j],   α^h_ij = softmax_j(s^h_ij),

    with j restricted to j ≤ i when causal; y_i = Σ_h W_O^h Σ_j α^h_ij W_V^h x_j.
    Implements {prf:ref}`prop-softmax-attention`: 𝒲_ij(X) = Σ_h α^h_ij(X) V_h with
    V_h = W_O^h W_V^h, so the interaction rank is at most H.

    Args:
        W_Q: shape (H, d_k, d).   W_K: shape (H, d_k, d).
        W_V: shape (H, d_v, d).   W_O: shape (H, p, d_v).
        causal: if True (default), token i attends only to j ≤ i.
        position_bias: optional relative-position bias b, shape (H, n_max), b[h, ℓ]
            added to the score at lag ℓ = i − j.  Only defined for causal attention
            (lags are then 0..n−1) and limits sequences to n ≤ n_max.
        dtype: computation dtype (default float64).
    """

    _QUERY_BLOCK = 512

    def __init__(self, W_Q: Any, W_K: Any, W_V: Any, W_O: Any, *, causal: bool = True,
                 position_bias: Any = None, dtype: Any = torch.float64) -> None:
        super().__init__(W_Q, W_K, W_V, W_O, causal, dtype)
        self._bias = None
        if position_bias is not None:
            if not causal:
                raise ValueError("position_bias is only supported with causal=True (lags i - j >= 0)")
            self._bias = as_parameter(position_bias, "position_bias", ("H", "n_max"), {"H": self.H}, dtype=self.dtype)
            self.max_length = self._bias.shape[1]

    @classmethod
    def random(cls, d: int, p: int, heads: int = 1, *, d_k: int | None = None, d_v: int | None = None,
               causal: bool = True, seed: Any = 0, dtype: Any = torch.float64) -> "SoftmaxAttention":
        """Gaussian projections (N(0, 1/d); W_O N(0, 1/(H d_v))), d_k = d_v = max(1, d // heads) by default."""
        return cls(**cls._random_projections(d, p, heads, d_k, d_v, seed), causal=causal, dtype=dtype)

    @property
    def position_bias(self) -> np.ndarray | None:
        """b, shape (H, n_max), or None."""
        return None if self._bias is None else _to_numpy(self._bias)

    def scores(self, X: Any) -> torch.Tensor | np.ndarray:
        """The pre-softmax scores s^h_ij(X), shape (H, n, n) or (b, H, n, n); −inf for j > i if causal."""
        return self._apply(self._scores, X)

    def _scores(self, X: torch.Tensor) -> torch.Tensor:
        Q, K, _ = self._project(X)
        return self._score_rows(Q, K, 0)

    def _score_rows(self, Q: torch.Tensor, K: torch.Tensor, start: int) -> torch.Tensor:
        # Scores of the queries Q (b, H, m, d_k), at positions start..start+m−1, against all keys.
        s = Q @ K.transpose(-1, -2) / math.sqrt(self.d_k)
        if self.causal:
            lag = (torch.arange(start, start + Q.shape[2], device=Q.device)[:, None]
                   - torch.arange(K.shape[2], device=K.device)[None, :])
            if self._bias is not None:
                s = s + self._bias[:, lag.clamp(min=0)]
            s = s.masked_fill(lag < 0, -math.inf)
        return s

    def _weights(self, X: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self._scores(X), dim=-1)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        Q, K, V = self._project(X)
        # Blocks of queries keep memory at O(block · n) per head on long sequences.
        mixed = [torch.softmax(self._score_rows(Q[:, :, start:start + self._QUERY_BLOCK], K, start), dim=-1) @ V
                 for start in range(0, X.shape[1], self._QUERY_BLOCK)]
        return self._output(torch.cat(mixed, 2))


def elu_plus_one(u: torch.Tensor) -> torch.Tensor:
    """φ(u) = elu(u) + 1 > 0, the feature map of Katharopoulos et al. (2020).

    Computed as u + 1 for u > 0 and e^u for u <= 0: the literal (e^u − 1) + 1 loses the
    relative accuracy of e^u for u ≪ 0 (about 1e-3 at u = −30) and rounds it to 0 below
    u ≈ −37, which would zero the normaliser of a query far sooner than e^u underflows.
    """
    return torch.where(u > 0, u + 1, torch.exp(torch.clamp(u, max=0.0)))


class LinearAttention(_MultiHead):
    """Multi-head linear attention (Katharopoulos et al. 2020), bias-free projections.

    With a positive feature map φ (default elu + 1), q_i = W_Q^h x_i, k_j = W_K^h x_j:

        α^h_ij = φ(q_i)ᵀφ(k_j) / Σ_{j'} φ(q_i)ᵀφ(k_{j'})      (j, j' ≤ i when causal),

    computed in the forward pass without forming α, from running sums
    S_i = Σ_{j≤i} φ(k_j)(W_V^h x_j)ᵀ and z_i = Σ_{j≤i} φ(k_j):
    y_i = Σ_h W_O^h S_iᵀφ(q_i) / (φ(q_i)ᵀ z_i) (full sums when not causal).
    Implements {prf:ref}`prop-linear-attention`: 𝒲_ij(X) = Σ_h α^h_ij(X) V_h.

    Args:
        W_Q: shape (H, d_k, d).   W_K: shape (H, d_k, d).
        W_V: shape (H, d_v, d).   W_O: shape (H, p, d_v).
        causal: if True (default), token i attends only to j ≤ i.
        feature_map: a torch function applied elementwise to queries and keys; its
            values must be positive (ValueError otherwise, when a normaliser is <= 0).
        dtype: computation dtype (default float64).
    """

    def __init__(self, W_Q: Any, W_K: Any, W_V: Any, W_O: Any, *, causal: bool = True,
                 feature_map: Callable[[torch.Tensor], torch.Tensor] = elu_plus_one,
                 dtype: Any = torch.float64) -> None:
        super().__init__(W_Q, W_K, W_V, W_O, causal, dtype)
        if not callable(feature_map):
            raise TypeError(f"feature_map must be callable; got {type(feature_map).__name__}")
        self.feature_map = feature_map

    @classmethod
    def random(cls, d: int, p: int, heads: int = 1, *, d_k: int | None = None, d_v: int | None = None,
               causal: bool = True, feature_map: Callable[[torch.Tensor], torch.Tensor] = elu_plus_one,
               seed: Any = 0, dtype: Any = torch.float64) -> "LinearAttention":
        """Gaussian projections as in SoftmaxAttention.random."""
        return cls(**cls._random_projections(d, p, heads, d_k, d_v, seed), causal=causal,
                   feature_map=feature_map, dtype=dtype)

    def _features(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        Q, K, V = self._project(X)
        return self.feature_map(Q), self.feature_map(K), V

    @staticmethod
    def _normalise(numerator: torch.Tensor, normaliser: torch.Tensor) -> torch.Tensor:
        if not bool((normaliser > 0).all()):
            raise ValueError("feature_map must return positive features; got a normaliser <= 0 "
                             "(positive features can also underflow to 0: elu + 1 below about -745)")
        return numerator / normaliser

    def _weights(self, X: torch.Tensor) -> torch.Tensor:
        phi_q, phi_k, _ = self._features(X)
        kernel = phi_q @ phi_k.transpose(-1, -2)  # φ(q_i)ᵀφ(k_j), (b, H, n, n)
        if self.causal:
            kernel = torch.tril(kernel)
        return self._normalise(kernel, kernel.sum(-1, keepdim=True))

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        phi_q, phi_k, V = self._features(X)
        S = phi_k[..., :, None] * V[..., None, :]  # φ(k_j)(W_V x_j)ᵀ, (b, H, n, d_k, d_v)
        if self.causal:
            S, z = S.cumsum(2), phi_k.cumsum(2)
        else:
            S, z = S.sum(2, keepdim=True), phi_k.sum(2, keepdim=True)
        numerator = torch.einsum("bhnk,bhnkv->bhnv", phi_q, S.expand(*phi_q.shape, V.shape[-1]))
        normaliser = (phi_q * z).sum(-1, keepdim=True)
        return self._output(self._normalise(numerator, normaliser))
