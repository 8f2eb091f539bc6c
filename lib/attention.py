"""The factorized class ({prf:ref}`def-factorized`): softmax and linear attention, relative-position heads.

Each model has H heads with scalar weights α^h_ij(X) on shared value maps V_h ∈ ℝ^{p×d}:
𝒲_ij(X) = Σ_h α^h_ij(X) V_h, so its interaction rank is at most H. `values()` gives V (H, p, d).
Attention heads here have V_h = W_O^h W_V^h of any rank up to min(p, d, d_v): with the default
d_v = d // H they are d/H-wide as built; with d_v = d they can be any p × d map. SoftmaxAttention
is bias-free with per-head projections of any width; `MultiheadAttention` is the layer as built
(torch.nn.MultiheadAttention's parameters and biases, heads of width d/H, ALiBi or learned
position biases), whose biases give a constant `offset` beside the operator.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from ._validation import as_generator, check_int, check_real
from .base import SequenceMap, batched
from .operators import factorized_operator, toeplitz_operator
from .scan import fft_causal_conv


class _MultiHead(SequenceMap):
    """Projections W_Q, W_K (H, d_k, d), W_V (H, d_v, d), W_O (H, p, d_v)."""

    def __init__(self, W_Q: Any, W_K: Any, W_V: Any, W_O: Any, causal: bool, dtype: torch.dtype) -> None:
        super().__init__()
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
        dims = self.set_parameters(dtype, W_Q=(W_Q, "H d_k d"), W_K=(W_K, "H d_k d"),
                                   W_V=(W_V, "H d_v d"), W_O=(W_O, "H p d_v"))
        self.d, self.p, self.H, self.d_k, self.d_v = (dims[k] for k in ("d", "p", "H", "d_k", "d_v"))
        self.causal = causal

    @staticmethod
    def _random_projections(d: int, p: int, heads: int, d_k: int | None, d_v: int | None, seed: Any) -> dict:
        # W_Q, W_K, W_V with iid N(0, 1/d) entries, W_O with N(0, 1/(H d_v)); d_k = d_v = d // H by default.
        d, p, heads = check_int(d, "d"), check_int(p, "p"), check_int(heads, "heads")
        d_k = max(1, d // heads) if d_k is None else check_int(d_k, "d_k")
        d_v = max(1, d // heads) if d_v is None else check_int(d_v, "d_v")
        rng = as_generator(seed)
        shapes = {"W_Q": (d_k, d, d), "W_K": (d_k, d, d), "W_V": (d_v, d, d), "W_O": (p, d_v, heads * d_v)}
        return {name: rng.standard_normal((heads, rows, cols)) / np.sqrt(fan_in)
                for name, (rows, cols, fan_in) in shapes.items()}

    def values(self) -> torch.Tensor:
        """V_h = W_O^h W_V^h, shape (H, p, d)."""
        return self.W_O @ self.W_V

    def _project(self, X: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Queries, keys, values per head: (b, H, n, d_k), (b, H, n, d_k), (b, H, n, d_v).
        return tuple(torch.einsum("hkd,bnd->bhnk", W, X) for W in (self.W_Q, self.W_K, self.W_V))

    def _output(self, mixed: torch.Tensor) -> torch.Tensor:
        # Σ_h W_O^h (head h's mixed values): (b, H, n, d_v) -> (b, n, p).
        return torch.einsum("hpv,bhnv->bnp", self.W_O, mixed)

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        return factorized_operator(self.weights(X), self.values())


class SoftmaxAttention(_MultiHead):
    """Multi-head softmax attention with bias-free projections, optionally causal.

    z^h_ij = (W_Q^h x_i)·(W_K^h x_j)/√d_k + b_h[i − j], α^h_ij = softmax_j(z^h_ij) (j <= i if
    causal); {prf:ref}`prop-softmax-attention`: 𝒲_ij(X) = Σ_h α^h_ij(X) V_h. The optional
    learned relative-position scores b (H, n_max) need causal=True and cap n at n_max.
    """

    _QUERY_BLOCK = 512  # queries per block: O(block · n) memory on long sequences

    def __init__(self, W_Q: Any, W_K: Any, W_V: Any, W_O: Any, *, causal: bool = True,
                 position_bias: Any = None, dtype: torch.dtype = torch.float64) -> None:
        super().__init__(W_Q, W_K, W_V, W_O, causal, dtype)
        if position_bias is None:
            self.position_bias = None
        elif not causal:
            raise ValueError("position_bias needs causal=True (lags i − j >= 0)")
        else:
            dims = self.set_parameters(dtype, {"H": self.H}, position_bias=(position_bias, "H n_max"))
            self.max_length = dims["n_max"]

    @classmethod
    def random(cls, d: int, p: int, heads: int = 1, *, d_k: int | None = None, d_v: int | None = None,
               causal: bool = True, max_length: int | None = None, seed: Any = 0,
               dtype: torch.dtype = torch.float64) -> "SoftmaxAttention":
        """Gaussian projections (see `_random_projections`); with max_length, zero position scores."""
        projections = cls._random_projections(d, p, heads, d_k, d_v, seed)
        bias = None if max_length is None else np.zeros((heads, check_int(max_length, "max_length")))
        return cls(**projections, causal=causal, position_bias=bias, dtype=dtype)

    def _score_rows(self, Q: torch.Tensor, K: torch.Tensor, start: int) -> torch.Tensor:
        # Scores of the queries Q (b, H, m, d_k) at positions start.. against all keys.
        s = Q @ K.transpose(-1, -2) / math.sqrt(self.d_k)
        if self.causal:
            positions = torch.arange(K.shape[2], device=Q.device)
            lag = positions[start:start + Q.shape[2], None] - positions[None, :]
            if self.position_bias is not None:
                s = s + self.position_bias[:, lag.clamp(min=0)]
            s = s.masked_fill(lag < 0, -math.inf)
        return s

    @batched
    def scores(self, X: torch.Tensor) -> torch.Tensor:
        """z^h_ij(X), shape (b, H, n, n); −inf for j > i if causal."""
        Q, K, _ = self._project(X)
        return self._score_rows(Q, K, 0)

    @batched
    def weights(self, X: torch.Tensor) -> torch.Tensor:
        """α^h_ij(X), shape (b, H, n, n)."""
        return torch.softmax(self.scores(X), dim=-1)

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Q, K, V = self._project(X)
        mixed = [torch.softmax(self._score_rows(Q[:, :, start:start + self._QUERY_BLOCK], K, start), dim=-1) @ V
                 for start in range(0, X.shape[1], self._QUERY_BLOCK)]
        return self._output(torch.cat(mixed, 2))


def elu_plus_one(u: torch.Tensor) -> torch.Tensor:
    """φ(u) = elu(u) + 1 > 0, as u + 1 above 0 and e^u below (the literal (e^u − 1) + 1 loses
    e^u's relative accuracy for u ≪ 0)."""
    return torch.where(u > 0, u + 1, torch.exp(torch.clamp(u, max=0.0)))


class LinearAttention(_MultiHead):
    """Multi-head linear attention (Katharopoulos et al. 2020) with a positive feature map φ.

    α^h_ij = φ(q_i)ᵀφ(k_j) / Σ_{j'} φ(q_i)ᵀφ(k_{j'}) (j, j' <= i if causal), computed by running
    sums, never forming α; {prf:ref}`prop-linear-attention`: 𝒲_ij(X) = Σ_h α^h_ij(X) V_h.
    feature_map: elementwise, positive (default elu + 1); a normaliser <= 0 raises ValueError.
    """

    def __init__(self, W_Q: Any, W_K: Any, W_V: Any, W_O: Any, *, causal: bool = True,
                 feature_map: Callable[[torch.Tensor], torch.Tensor] = elu_plus_one,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__(W_Q, W_K, W_V, W_O, causal, dtype)
        if not callable(feature_map):
            raise TypeError(f"feature_map must be callable; got {type(feature_map).__name__}")
        self.feature_map = feature_map

    @classmethod
    def random(cls, d: int, p: int, heads: int = 1, *, d_k: int | None = None, d_v: int | None = None,
               causal: bool = True, seed: Any = 0, dtype: torch.dtype = torch.float64) -> "LinearAttention":
        """Gaussian projections as in SoftmaxAttention.random."""
        return cls(**cls._random_projections(d, p, heads, d_k, d_v, seed), causal=causal, dtype=dtype)

    @staticmethod
    def _normalise(numerator: torch.Tensor, normaliser: torch.Tensor) -> torch.Tensor:
        if not bool((normaliser > 0).all()):
            raise ValueError("feature_map must return positive features; got a normaliser <= 0 "
                             "(elu + 1 underflows to 0 below about -745)")
        return numerator / normaliser

    @batched
    def weights(self, X: torch.Tensor) -> torch.Tensor:
        """α^h_ij(X), shape (b, H, n, n)."""
        Q, K, _ = self._project(X)
        kernel = self.feature_map(Q) @ self.feature_map(K).transpose(-1, -2)  # φ(q_i)ᵀφ(k_j)
        if self.causal:
            kernel = torch.tril(kernel)
        return self._normalise(kernel, kernel.sum(-1, keepdim=True))

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Q, K, V = self._project(X)
        phi_q, phi_k = self.feature_map(Q), self.feature_map(K)
        S = phi_k[..., :, None] * V[..., None, :]  # φ(k_j)(W_V x_j)ᵀ, (b, H, n, d_k, d_v)
        if self.causal:
            S, z = S.cumsum(2), phi_k.cumsum(2)
        else:
            S, z = S.sum(2, keepdim=True), phi_k.sum(2, keepdim=True)
        numerator = torch.einsum("bhnk,bhnkv->bhnv", phi_q, S.expand(*phi_q.shape, V.shape[-1]))
        return self._output(self._normalise(numerator, (phi_q * z).sum(-1, keepdim=True)))


class RelativeHeads(SequenceMap):
    """H causal heads with lag-only coefficients: 𝒲_ij = Σ_h c[h, i − j] V_h, V (H, p, d), c (H, n_max).

    The input-independent case of {prf:ref}`def-factorized`, the model class of
    {prf:ref}`thm-head-count`; coefficients are signed and unnormalised, n <= n_max. H = 0 is
    the zero map. Forward: a Toeplitz product up to n = 512, an FFT convolution beyond.
    """

    _DIRECT_UP_TO = 512

    def __init__(self, V: Any, coefficients: Any, *, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, V=(V, "H? p d"), coefficients=(coefficients, "H? n_max"))
        self.d, self.p, self.H, self.max_length = dims["d"], dims["p"], dims["H"], dims["n_max"]

    @classmethod
    def random(cls, H: int, n_max: int, d: int, p: int, *, decay: float = 0.9, scale: float = 1.0,
               seed: Any = 0, dtype: torch.dtype = torch.float64) -> "RelativeHeads":
        """V with iid N(0, 1/d) entries; c[h, ℓ] = scale · decay^ℓ · N(0, 1)."""
        H, n_max, d, p = check_int(H, "H"), check_int(n_max, "n_max"), check_int(d, "d"), check_int(p, "p")
        decay, scale = check_real(decay, "decay"), check_real(scale, "scale", low=0)
        rng = as_generator(seed)
        V = rng.standard_normal((H, p, d)) / np.sqrt(d)
        return cls(V, scale * rng.standard_normal((H, n_max)) * decay ** np.arange(n_max), dtype=dtype)

    def values(self) -> torch.Tensor:
        """V_h, shape (H, p, d)."""
        return self.V

    def lags(self, n: int) -> torch.Tensor:
        """L̂_ℓ = Σ_h c[h, ℓ] V_h for ℓ = 0..n−1 (n <= n_max), shape (n, p, d)."""
        n = check_int(n, "n")
        if n > self.max_length:
            raise ValueError(f"n must be <= n_max = {self.max_length}; got {n}")
        return torch.einsum("hl,hpd->lpd", self.coefficients[:, :n], self.V)

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if self.H == 0:
            return X.new_zeros(*X.shape[:2], self.p)
        projected, n = torch.einsum("hpd,bnd->bnhp", self.V, X), X.shape[1]  # V_h x_j
        if n > self._DIRECT_UP_TO:
            return fft_causal_conv(projected, self.coefficients.T, "fh,bfhp->bfp")
        return torch.einsum("ijh,bjhp->bip", toeplitz_operator(self.coefficients.T, n), projected)

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        alpha = toeplitz_operator(self.coefficients.T, n).permute(2, 0, 1)  # (H, n, n)
        return factorized_operator(alpha.expand(b, -1, -1, -1), self.V)


def alibi_slopes(H: int) -> torch.Tensor:
    """ALiBi's head slopes (Press et al. 2022, their `get_slopes`), float64, shape (H,).

    For H a power of two, m_h = 2^(−8h/H), h = 1..H. Otherwise, with P the largest power of two
    below H: the P slopes for P, then the first H − P of every other slope for 2P (m = 2^(−4(2h−1)/P),
    h = 1..H − P); so for H = 3: 2^−4, 2^−8, 2^−2.
    """
    H = check_int(H, "H")
    P = 1 << (H.bit_length() - 1)                       # the largest power of two <= H
    h = torch.arange(1, H + 1, dtype=torch.float64)
    if P == H:
        return 2.0 ** (-8.0 * h / H)
    extra = torch.arange(1, H - P + 1, dtype=torch.float64)
    return torch.cat([2.0 ** (-8.0 * h[:P] / P), 2.0 ** (-8.0 * (2 * extra - 1) / (2 * P))])


class MultiheadAttention(SequenceMap):
    """Causal multi-head softmax attention as built: H heads of width r = d/H, biases, p = d.

    torch.nn.MultiheadAttention's parameters and names: in_proj_weight (3d, d) = [W_Q; W_K; W_V],
    in_proj_bias (3d,), out_proj.weight W_O (d, d), out_proj.bias b_O (d,); head h takes rows
    h·r..(h+1)·r − 1 (0-based) of each projection and columns of W_O, so `load_state_dict` of an
    `nn.MultiheadAttention(d, H, batch_first=True)` works strictly (with a learned bias, that one key
    is extra: load with strict=False and set it). torch's forward agrees with attn_mask =
    `bias(n)` (causal + position bias as a float mask, repeated over the batch). Scores
    z^h_ij = (W_Q^h x_i + b_Q^h)·(W_K^h x_j + b_K^h)/√r + β_h(i − j), j <= i; position bias
    "alibi": β_h(ℓ) = −m_h ℓ (`alibi_slopes`); "learned": parameter position_bias (H, n_max);
    None: 0. {prf:ref}`prop-softmax-attention`: y_i = Σ_j 𝒲_ij(X) x_j + offset, with
    𝒲_ij(X) = Σ_h α^h_ij(X) W_O^h W_V^h (`operator`, `values`, rank V_h <= d/H) and the constant
    offset Σ_h W_O^h b_V^h + b_O (`offset`), since each head's weights sum to one over j <= i.
    No dropout, no key padding mask; always causal.
    """

    def __init__(self, d: int, H: int, *, position_bias: str | None = None, max_length: int | None = None,
                 seed: Any = 0, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        d, H = check_int(d, "d"), check_int(H, "H")
        if d % H:
            raise ValueError(f"H must divide d (heads of width d/H); got d = {d}, H = {H}")
        if position_bias not in (None, "alibi", "learned"):
            raise ValueError(f"position_bias must be None, 'alibi' or 'learned'; got {position_bias!r}")
        if (position_bias == "learned") != (max_length is not None):
            raise ValueError("max_length must be given exactly when position_bias = 'learned'; "
                             f"got position_bias = {position_bias!r}, max_length = {max_length!r}")
        self.d, self.p, self.H, self.width, self.causal = d, d, H, d // H, True
        self.position_bias_kind = position_bias
        rng = as_generator(seed)  # nn.MultiheadAttention's init: Xavier-uniform in_proj, zero biases
        bound = math.sqrt(6.0 / (3 * d + d))
        shapes = {"in_proj_weight": (rng.uniform(-bound, bound, (3 * d, d)), "t d"),
                  "in_proj_bias": (np.zeros(3 * d), "t")}
        self.set_parameters(dtype, {"t": 3 * d, "d": d}, **shapes)
        self.out_proj = torch.nn.Linear(d, d, dtype=dtype)
        with torch.no_grad():
            self.out_proj.weight.copy_(torch.from_numpy(rng.uniform(-1, 1, (d, d)) / math.sqrt(d)))
            self.out_proj.bias.zero_()
        if position_bias == "learned":
            self.max_length = check_int(max_length, "max_length")
            self.set_parameters(dtype, {"H": H}, position_bias=(np.zeros((H, self.max_length)), "H n_max"))

    def _heads(self, W: torch.Tensor) -> torch.Tensor:
        # (3d, ·) rows -> Q, K, V blocks of H heads: (3, H, r, ·).
        return W.reshape(3, self.H, self.width, *W.shape[1:])

    def values(self) -> torch.Tensor:
        """V_h = W_O^h W_V^h, shape (H, d, d), rank <= d/H."""
        W_V = self._heads(self.in_proj_weight)[2]                                  # (H, r, d)
        W_O = self.out_proj.weight.reshape(self.d, self.H, self.width).permute(1, 0, 2)  # (H, d, r)
        return W_O @ W_V

    def bias(self, n: int) -> torch.Tensor:
        """β_h(i − j) for 0 <= j <= i < n and −inf for j > i: the float attention mask, shape (H, n, n)."""
        n = check_int(n, "n")
        lag = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        dtype, device = self.in_proj_weight.dtype, self.in_proj_weight.device
        if self.position_bias_kind == "alibi":
            beta = -alibi_slopes(self.H).to(dtype)[:, None, None] * lag.clamp(min=0).to(dtype)
        elif self.position_bias_kind == "learned":
            if n > self.max_length:
                raise ValueError(f"n must be <= max_length = {self.max_length}; got {n}")
            beta = self.position_bias[:, lag.clamp(min=0)]
        else:
            beta = torch.zeros(self.H, n, n, dtype=dtype)
        return beta.to(device).masked_fill(lag < 0, -math.inf)

    def _project(self, X: torch.Tensor) -> torch.Tensor:
        # Q, K, V per head with biases: (3, b, H, n, r).
        W, b = self._heads(self.in_proj_weight), self._heads(self.in_proj_bias)
        return torch.einsum("thrd,bnd->tbhnr", W, X) + b[:, None, :, None, :]

    @batched
    def weights(self, X: torch.Tensor) -> torch.Tensor:
        """α^h_ij(X), shape (b, H, n, n)."""
        Q, K, _ = self._project(X)
        return torch.softmax(Q @ K.transpose(-1, -2) / math.sqrt(self.width) + self.bias(X.shape[1]), dim=-1)

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        mixed = self.weights(X) @ self._project(X)[2]                        # (b, H, n, r)
        return self.out_proj(mixed.permute(0, 2, 1, 3).reshape(*X.shape[:2], self.d))

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        """𝒲_ij(X) = Σ_h α^h_ij(X) W_O^h W_V^h, shape (b, n, n, d, d); the biases are in `offset`."""
        return factorized_operator(self.weights(X), self.values())

    @batched
    def offset(self, X: torch.Tensor) -> torch.Tensor:
        """Σ_h W_O^h b_V^h + b_O at every position, shape (b, n, d): y = Σ_j 𝒲_ij x_j + offset."""
        b_V = self._heads(self.in_proj_bias)[2].reshape(self.d)
        return (self.out_proj.weight @ b_V + self.out_proj.bias).expand(*X.shape[:2], self.d)
