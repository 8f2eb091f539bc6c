"""Multi-head softmax attention and linear attention: the factorized class's archetypes.

Both mix tokens through per-head weights α^h_ij(X) applied to shared value maps
V_h = W_O^h W_V^h ∈ ℝ^{p×d}: y_i = Σ_h W_O^h Σ_j α^h_ij W_V^h x_j, so
𝒲_ij(X) = Σ_h α^h_ij(X) V_h ({prf:ref}`def-factorized` with H heads). They differ only in α.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from ._validation import check_int, resolve_dtype
from .base import SequenceMap, _view, exposed
from .factorized import factorized_operator


class _MultiHead(SequenceMap):
    """Projections W_Q, W_K (H, d_k, d), W_V (H, d_v, d), W_O (H, p, d_v) and the operator."""

    def __init__(self, W_Q: Any, W_K: Any, W_V: Any, W_O: Any, causal: bool, dtype: Any) -> None:
        super().__init__(resolve_dtype(dtype))
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
        dims = self._set_parameters(W_Q=(W_Q, ("H", "d_k", "d")), W_K=(W_K, ("H", "d_k", "d")),
                                    W_V=(W_V, ("H", "d_v", "d")), W_O=(W_O, ("H", "p", "d_v")))
        self.d, self.p, self.H, self.d_k, self.d_v = (dims[k] for k in ("d", "p", "H", "d_k", "d_v"))
        self.causal = causal

    @classmethod
    def _random_projections(cls, d: int, p: int, heads: int, d_k: int | None, d_v: int | None, seed: Any) -> dict:
        # W_Q, W_K, W_V with iid N(0, 1/d) entries, W_O with iid N(0, 1/(H d_v)).
        d, p, heads = check_int(d, "d"), check_int(p, "p"), check_int(heads, "heads")
        d_k = max(1, d // heads) if d_k is None else check_int(d_k, "d_k")
        d_v = max(1, d // heads) if d_v is None else check_int(d_v, "d_v")
        rng = np.random.default_rng(seed)
        shapes = {"W_Q": (d_k, d, d), "W_K": (d_k, d, d), "W_V": (d_v, d, d), "W_O": (p, d_v, heads * d_v)}
        return {name: rng.standard_normal((heads, rows, cols)) / np.sqrt(fan_in)
                for name, (rows, cols, fan_in) in shapes.items()}

    W_Q = exposed("W_Q")
    W_K = exposed("W_K")
    W_V = exposed("W_V")
    W_O = exposed("W_O")

    def values(self) -> np.ndarray:
        """The shared value maps V_h = W_O^h W_V^h, shape (H, p, d)."""
        return self._values().detach().cpu().numpy()

    def weights(self, X: Any) -> torch.Tensor | np.ndarray:
        """α^h_ij(X), shape (H, n, n) or (b, H, n, n); zero for j > i if causal."""
        return self._at_edge(self._weights, X)

    def _values(self) -> torch.Tensor:
        return self._W_O @ self._W_V

    def _project(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Per-head queries, keys, values: (b, H, n, d_k), (b, H, n, d_k), (b, H, n, d_v).
        return tuple(torch.einsum("hkd,bnd->bhnk", W, X) for W in (self._W_Q, self._W_K, self._W_V))

    def _output(self, mixed: torch.Tensor) -> torch.Tensor:
        # Σ_h W_O^h (mixed values of head h): (b, H, n, d_v) -> (b, n, p).
        return torch.einsum("hpv,bhnv->bnp", self._W_O, mixed)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        return factorized_operator(self._weights(X), self._values())

    def _sizes(self) -> dict[str, int]:
        return {"H": self.H, "d_k": self.d_k, "d_v": self.d_v, **super()._sizes()}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, causal={self.causal}"


class SoftmaxAttention(_MultiHead):
    """Multi-head (optionally causal) softmax attention with bias-free projections.

    z^h_ij = (W_Q^h x_i)·(W_K^h x_j)/√d_k + b_h[i−j], α^h_ij = softmax_j(z^h_ij) (j ≤ i when
    causal). Implements {prf:ref}`prop-softmax-attention`: 𝒲_ij(X) = Σ_h α^h_ij(X) V_h.

    Args:
        W_Q, W_K: shape (H, d_k, d).  W_V: shape (H, d_v, d).  W_O: shape (H, p, d_v).
        causal: token i attends only to j ≤ i (default True).
        position_bias: optional b, shape (H, n_max), added at lag i − j; causal only, and
            limits sequences to n ≤ n_max.
    """

    _QUERY_BLOCK = 512  # queries per block: O(block · n) memory on long sequences

    def __init__(self, W_Q: Any, W_K: Any, W_V: Any, W_O: Any, *, causal: bool = True,
                 position_bias: Any = None, dtype: Any = torch.float64) -> None:
        super().__init__(W_Q, W_K, W_V, W_O, causal, dtype)
        if position_bias is None:
            self._position_bias = None
        elif not causal:
            raise ValueError("position_bias is only supported with causal=True (lags i - j >= 0)")
        else:
            dims = self._set_parameters({"H": self.H}, position_bias=(position_bias, ("H", "n_max")))
            self.max_length = dims["n_max"]

    @classmethod
    def random(cls, d: int, p: int, heads: int = 1, *, d_k: int | None = None, d_v: int | None = None,
               causal: bool = True, seed: Any = 0, dtype: Any = torch.float64) -> "SoftmaxAttention":
        """Gaussian projections (W_Q, W_K, W_V: N(0, 1/d); W_O: N(0, 1/(H d_v))); d_k = d_v = d // H."""
        return cls(**cls._random_projections(d, p, heads, d_k, d_v, seed), causal=causal, dtype=dtype)

    @property
    def position_bias(self) -> np.ndarray | None:
        """b, shape (H, n_max), or None."""
        return None if self._position_bias is None else _view(self._position_bias)

    def scores(self, X: Any) -> torch.Tensor | np.ndarray:
        """The scores z^h_ij(X), shape (H, n, n) or (b, H, n, n); −inf for j > i if causal."""
        return self._at_edge(self._scores, X)

    def _scores(self, X: torch.Tensor) -> torch.Tensor:
        Q, K, _ = self._project(X)
        return self._score_rows(Q, K, 0)

    def _score_rows(self, Q: torch.Tensor, K: torch.Tensor, start: int) -> torch.Tensor:
        # Scores of queries Q (b, H, m, d_k) at positions start.. against all keys.
        s = Q @ K.transpose(-1, -2) / math.sqrt(self.d_k)
        if self.causal:
            lag = (torch.arange(start, start + Q.shape[2], device=Q.device)[:, None]
                   - torch.arange(K.shape[2], device=K.device)[None, :])
            if self._position_bias is not None:
                s = s + self._position_bias[:, lag.clamp(min=0)]
            s = s.masked_fill(lag < 0, -math.inf)
        return s

    def _weights(self, X: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self._scores(X), dim=-1)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        Q, K, V = self._project(X)
        mixed = [torch.softmax(self._score_rows(Q[:, :, start:start + self._QUERY_BLOCK], K, start), dim=-1) @ V
                 for start in range(0, X.shape[1], self._QUERY_BLOCK)]
        return self._output(torch.cat(mixed, 2))


def elu_plus_one(u: torch.Tensor) -> torch.Tensor:
    """φ(u) = elu(u) + 1 > 0 (Katharopoulos et al. 2020), as u + 1 for u > 0 and e^u below.

    The literal (e^u − 1) + 1 loses e^u's relative accuracy for u ≪ 0 and is 0 below u ≈ −37.
    """
    return torch.where(u > 0, u + 1, torch.exp(torch.clamp(u, max=0.0)))


class LinearAttention(_MultiHead):
    """Multi-head linear attention (Katharopoulos et al. 2020) with a positive feature map φ.

    α^h_ij = φ(q_i)ᵀφ(k_j) / Σ_{j'} φ(q_i)ᵀφ(k_{j'}) (j, j' ≤ i when causal); the forward pass
    uses running sums S_i = Σ_{j≤i} φ(k_j)(W_V x_j)ᵀ, ν_i = Σ_{j≤i} φ(k_j) and never forms α.
    Implements {prf:ref}`prop-linear-attention`: 𝒲_ij(X) = Σ_h α^h_ij(X) V_h.

    Args:
        W_Q, W_K: shape (H, d_k, d).  W_V: shape (H, d_v, d).  W_O: shape (H, p, d_v).
        causal: token i attends only to j ≤ i (default True).
        feature_map: elementwise torch function with positive values (default elu + 1);
            a normaliser <= 0 raises ValueError.
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
        return self._output(self._normalise(numerator, (phi_q * z).sum(-1, keepdim=True)))
