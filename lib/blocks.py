"""The Mamba and Mamba-2 blocks as built: convolution, gate, skip, norm and projections around the scan.

`MambaBlock` and `Mamba2Block` are the mixers of mamba_ssm's `Mamba` and `Mamba2` modules, with
their parameter names and shapes (= transformers' `MambaMixer` / `Mamba2Mixer` state dicts:
`block.load_state_dict(mixer.state_dict(), strict=True)` works both ways), d = p = d_model.
They differ from `lib.ssm.SelectiveSSM` / `SSD`, the scans alone, by everything around the scan.

Both blocks have the operator form ({prf:ref}`prop-mamba-block`, {prf:ref}`prop-mamba2-block`)

    y_i = Σ_{j<=i} U diag(g_ij(X)) V x_j + β_i(X),

U = out_proj.weight (d_model, d_inner), V the x-rows of in_proj.weight (d_inner, d_model),
g_ij ∈ ℝ^{d_inner}: `coefficients(X)` → g (b, n, n, d_inner), `factors()` → (U, V),
`operator(X)` → 𝒲 (b, n, n, d, d), `offset(X)` → β (b, n, d). The offset is zero without
biases (bias=False, conv_bias=False); with biases the decomposition is affine. Positions 0-based.
Not modelled: caches / step-by-step decoding, attention masks, Mamba-2's dt_limit clamp (its
default (0, ∞) is a no-op) and d_ssm < d_inner. Softplus is evaluated exactly up to z = 40
(torch's default switches to z at 20: a relative difference below e⁻²⁰ in Δ).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import as_generator, check_choice, check_dtype, check_int, check_real
from .base import SequenceMap, batched
from .scan import selective_loop, selective_scan, ssd_chunked, ssd_loop, ssd_quadratic
from .ssm import _segment_sums, _softplus


def _check_flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return value


def _check_steps(dt_min: Any, dt_max: Any, dt_init_floor: Any) -> tuple[float, float, float]:
    lo = check_real(dt_min, "dt_min", low=0, open_interval=True)
    hi = check_real(dt_max, "dt_max", low=lo)
    return lo, hi, check_real(dt_init_floor, "dt_init_floor", low=0)


def _uniform(rng: np.random.Generator, bound: float, *shape: int) -> np.ndarray:
    return rng.uniform(-bound, bound, size=shape)


def _step_bias(rng: np.random.Generator, size: int, lo: float, hi: float, floor: float) -> np.ndarray:
    """softplus⁻¹ of Δ log-uniform in [lo, hi], floored at `floor` (mamba_ssm's dt init)."""
    step = np.maximum(np.exp(rng.uniform(np.log(lo), np.log(hi), size=size)), floor)
    return step + np.log(-np.expm1(-step))


def _linear(rng: np.random.Generator, fan_in: int, fan_out: int, bias: bool, dtype: torch.dtype) -> torch.nn.Linear:
    """nn.Linear with torch's default init, U(±1/√fan_in) for weight and bias, drawn from rng."""
    layer = torch.nn.Linear(fan_in, fan_out, bias=bias, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(_uniform(rng, fan_in ** -0.5, fan_out, fan_in)))
        if bias:
            layer.bias.copy_(torch.from_numpy(_uniform(rng, fan_in ** -0.5, fan_out)))
    return layer


def _conv(rng: np.random.Generator, channels: int, taps: int, bias: bool, dtype: torch.dtype) -> torch.nn.Conv1d:
    """Depthwise causal nn.Conv1d (padding taps − 1, the first n outputs kept), torch's default init."""
    conv = torch.nn.Conv1d(channels, channels, taps, groups=channels, padding=taps - 1, bias=bias, dtype=dtype)
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(_uniform(rng, taps ** -0.5, channels, 1, taps)))
        if bias:
            conv.bias.copy_(torch.from_numpy(_uniform(rng, taps ** -0.5, channels)))
    return conv


class _GatedRMSNorm(torch.nn.Module):
    """norm(y, z) = weight ⊙ r / rms_g(r), r = y ⊙ silu(z), rms over groups of `group` consecutive
    channels: mamba_ssm's RMSNormGated(norm_before_gate=False) = transformers' MambaRMSNormGated."""

    def __init__(self, width: int, group: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width, dtype=dtype))
        self.group, self.eps = group, eps

    def inverse_rms(self, r: torch.Tensor) -> torch.Tensor:
        """1/rms of each channel's group, shape of r."""
        grouped = r.unflatten(-1, (-1, self.group))
        scale = torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return scale.expand_as(grouped).flatten(-2)


class _Block(SequenceMap):
    """What the two blocks share: the causal depthwise conv, the operator form and its pieces."""

    d_inner: int
    d_conv: int

    def _convolve(self, u: torch.Tensor) -> torch.Tensor:
        # (b, n, c) → (b, n, c): c_m = Σ_k w_k ⊙ u_{m−k} + bias, w_k = weight[:, 0, K−1−k], by K
        # shifted products (torch's depthwise conv1d took ~75 ms a call on small float64 inputs here).
        n, weight = u.shape[1], self.conv1d.weight[:, 0]
        c = u * weight[:, -1]
        for k in range(1, min(self.d_conv, n)):
            c = c + F.pad(u[:, :n - k], (0, 0, k, 0)) * weight[:, -1 - k]
        return c if self.conv1d.bias is None else c + self.conv1d.bias

    def _x_bias(self) -> torch.Tensor | None:
        raise NotImplementedError

    def _pieces(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(P (b, n, n, d_inner), s (b, n, d_inner), c (b, n, d_inner)): P[:, i, m] = κ_im ⊙ σ(c_m),
        κ_im the scan's kernel with the skip (κ_im ⊙ v_m summed over m is the scan's output), s_i the
        output scale (gate, and the norm for Mamba-2), c the conv's pre-activation of the x-part."""
        raise NotImplementedError

    def taps(self) -> torch.Tensor:
        """w_k, k = 0..d_conv−1, of the x-part of the conv, shape (d_conv, d_inner): c_m = Σ_k w_k ⊙ u_{m−k}."""
        return self.conv1d.weight[:self.d_inner, 0].flip(-1).T

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(U (d_model, d_inner), V (d_inner, d_model)): out_proj.weight and in_proj's x-rows."""
        return self.out_proj.weight, self.in_proj.weight[self._x_rows]

    @batched
    def coefficients(self, X: torch.Tensor) -> torch.Tensor:
        """g_ij(X) ∈ ℝ^{d_inner}, shape (b, n, n, d_inner), zero for j > i:
        g_ij = s_i ⊙ Σ_{k=0}^{d_conv−1} w_k ⊙ κ_{i,j+k} ⊙ σ(c_{j+k}) (terms with j + k > i vanish)."""
        P, s, _ = self._pieces(X)
        return self._combine(P, s)

    def _combine(self, P: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        # g_ij = s_i ⊙ Σ_k w_k ⊙ P[:, i, j + k] from the pieces (b, n, n, d_inner), (b, n, d_inner).
        n, w = P.shape[1], self.taps()
        g = torch.zeros_like(P)
        for k in range(min(self.d_conv, n)):
            g[:, :, :n - k] += w[k] * P[:, :, k:]
        return s[:, :, None, :] * g

    @batched
    def offset(self, X: torch.Tensor) -> torch.Tensor:
        """β_i(X), shape (b, n, d_model): U(s_i ⊙ Σ_m κ_im ⊙ σ(c_m) ⊙ e_m) + out_proj.bias, with
        e_m = conv bias + Σ_{k<=min(d_conv−1, m)} w_k ⊙ (in_proj's x-bias) (the conv's padding is zero)."""
        P, s, _ = self._pieces(X)
        n, w = X.shape[1], self.taps()
        e = X.new_zeros(n, self.d_inner)
        if self.conv1d.bias is not None:
            e = e + self.conv1d.bias[:self.d_inner]
        x_bias = self._x_bias()
        if x_bias is not None:
            e = e + torch.cumsum(F.pad(w, (0, 0, 0, max(0, n - self.d_conv)))[:n], 0) * x_bias
        beta = (s * torch.einsum("bimq,mq->biq", P, e)) @ self.out_proj.weight.T
        return beta if self.out_proj.bias is None else beta + self.out_proj.bias

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        """𝒲_ij(X) = U diag(g_ij(X)) V, shape (b, n, n, d_model, d_model) (dense: for small widths)."""
        U, V = self.factors()
        return torch.einsum("pq,bijq,qd->bijpd", U, self.coefficients(X), V)


class MambaBlock(_Block):
    """Mamba's mixer (mamba_ssm `Mamba`, transformers `MambaMixer`): {prf:ref}`prop-mamba-block`.

        (u, z) = in_proj(x),  c = causal depthwise conv(u),  v = silu(c),
        (δ, B, C) = x_proj(v),  Δ = softplus(dt_proj(δ)) (rank dt_rank, with bias),
        o = selective scan(Δ, A = −exp(A_log), B, C; v) + D ⊙ v,   y = out_proj(o ⊙ silu(z)).

    Parameters (names and shapes of mamba_ssm / transformers): in_proj (2 d_inner, d_model),
    conv1d (d_inner, 1, d_conv), x_proj (dt_rank + 2 d_state, d_inner), dt_proj (d_inner, dt_rank)
    with bias, A_log (d_inner, d_state), D (d_inner,), out_proj (d_model, d_inner);
    d_inner = expand · d_model, dt_rank "auto" = ⌈d_model/16⌉. Mamba's init, reproducible from
    `seed`: A_log = log(1..d_state) per channel, D = 1, dt_proj.weight U(±dt_rank^−½),
    softplus(dt_proj.bias) = Δ log-uniform in [dt_min, dt_max] floored at dt_init_floor,
    torch's Linear/Conv1d defaults otherwise. Routes (`method=`): "recurrence" (the loop),
    "scan" (lib.scan.selective_scan), "auto" (the scan from n = 64).
    """

    _SCAN_FROM = 64

    def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: int = 2, dt_rank: Any = "auto",
                 conv_bias: bool = True, bias: bool = False, *, dt_min: float = 1e-3, dt_max: float = 1e-1,
                 dt_init_floor: float = 1e-4, seed: Any = 0, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        d_model, d_state = check_int(d_model, "d_model"), check_int(d_state, "d_state")
        d_conv, expand = check_int(d_conv, "d_conv"), check_int(expand, "expand")
        dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else check_int(dt_rank, "dt_rank")
        conv_bias, bias = _check_flag(conv_bias, "conv_bias"), _check_flag(bias, "bias")
        lo, hi, floor = _check_steps(dt_min, dt_max, dt_init_floor)
        check_dtype(dtype)
        rng = as_generator(seed)
        D_in = expand * d_model
        self.d = self.p = self.d_model = d_model
        self.d_inner, self.d_state, self.d_conv, self.dt_rank = D_in, d_state, d_conv, dt_rank
        self._x_rows = slice(0, D_in)
        self.in_proj = _linear(rng, d_model, 2 * D_in, bias, dtype)
        self.conv1d = _conv(rng, D_in, d_conv, conv_bias, dtype)
        self.x_proj = _linear(rng, D_in, dt_rank + 2 * d_state, False, dtype)
        self.dt_proj = _linear(rng, dt_rank, D_in, True, dtype)
        with torch.no_grad():
            self.dt_proj.weight.copy_(torch.from_numpy(_uniform(rng, dt_rank ** -0.5, D_in, dt_rank)))
            self.dt_proj.bias.copy_(torch.from_numpy(_step_bias(rng, D_in, lo, hi, floor)))
        A = np.tile(np.arange(1, d_state + 1, dtype=float), (D_in, 1))
        self.A_log = torch.nn.Parameter(torch.from_numpy(np.log(A)).to(dtype))
        self.D = torch.nn.Parameter(torch.ones(D_in, dtype=dtype))
        self.out_proj = _linear(rng, D_in, d_model, bias, dtype)

    def _x_bias(self) -> torch.Tensor | None:
        return None if self.in_proj.bias is None else self.in_proj.bias[:self.d_inner]

    def _inner(self, X: torch.Tensor):
        # u, z, c, v, Δ, B, C at X.
        u, z = (X @ self.in_proj.weight.T + (0 if self.in_proj.bias is None else self.in_proj.bias)).split(
            self.d_inner, -1)
        c = self._convolve(u)
        v = F.silu(c)
        step, B, C = (v @ self.x_proj.weight.T).split([self.dt_rank, self.d_state, self.d_state], -1)
        delta = _softplus(step @ self.dt_proj.weight.T + self.dt_proj.bias)
        return z, c, v, delta, B, C

    @batched
    def forward(self, X: torch.Tensor, method: str = "auto") -> torch.Tensor:
        method = check_choice(method, "method", ("auto", "recurrence", "scan"))
        z, _, v, delta, B, C = self._inner(X)
        loop = method == "recurrence" or (method == "auto" and X.shape[1] < self._SCAN_FROM)
        o = (selective_loop if loop else selective_scan)(delta, -torch.exp(self.A_log), B, C, v) + self.D * v
        return self.out_proj(o * F.silu(z))

    def _pieces(self, X: torch.Tensor):
        z, c, _, delta, B, C = self._inner(X)
        n = X.shape[1]
        elapsed = _segment_sums(delta.transpose(1, 2)).permute(0, 2, 3, 1)   # Σ_{t=m+1}^{i} Δ_t, (b, i, m, q)
        decay = torch.exp(elapsed[..., None] * -torch.exp(self.A_log))     # (b, i, m, q, N)
        causal = torch.tril(torch.ones(n, n, dtype=X.dtype))[None, :, :, None]
        kappa = torch.einsum("bin,bimqn,bmn->bimq", C, decay, B) * delta[:, None] * causal
        kappa = kappa + torch.eye(n, dtype=X.dtype)[None, :, :, None] * self.D
        return kappa * torch.sigmoid(c)[:, None], F.silu(z), c


class Mamba2Block(_Block):
    """Mamba-2's mixer (mamba_ssm `Mamba2`, transformers `Mamba2Mixer`): {prf:ref}`prop-mamba2-block`.

        (z, xBC, dt) = in_proj(x),  (v, B, C) = silu(causal depthwise conv(xBC)),
        Δ^h = softplus(dt^h + dt_bias_h),  heads of width headdim, B and C shared per group,
        o = SSD(Δ, A = −exp(A_log); B, C; v) + D_h v^{(h)},  y = out_proj(norm(o ⊙ silu(z))),

    the norm an RMSNorm with weight over ngroups groups of d_inner/ngroups consecutive channels,
    eps `norm_eps`. Parameters: in_proj (2 d_inner + 2 ngroups d_state + nheads, d_model) (rows z,
    x, B, C, dt), conv1d (d_inner + 2 ngroups d_state, 1, d_conv), dt_bias, A_log, D (nheads,),
    norm.weight (d_inner,), out_proj (d_model, d_inner). Mamba-2's init from `seed`: A_log =
    log U(A_init_range), D = 1, norm weight 1, dt_bias as Mamba's, torch's defaults otherwise.
    Routes: "recurrence" (the loop), "scan" (lib.scan.ssd_chunked, chunks of chunk_size),
    "quadratic", "auto" (quadratic up to n = 64, then the scan).
    """

    _QUADRATIC_UP_TO = 64

    def __init__(self, d_model: int, d_state: int = 128, d_conv: int = 4, expand: int = 2, headdim: int = 64,
                 ngroups: int = 1, *, A_init_range: tuple[float, float] = (1, 16), dt_min: float = 1e-3,
                 dt_max: float = 1e-1, dt_init_floor: float = 1e-4, bias: bool = False, conv_bias: bool = True,
                 norm_eps: float = 1e-5, chunk_size: int = 256, seed: Any = 0,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        d_model, d_state = check_int(d_model, "d_model"), check_int(d_state, "d_state")
        d_conv, expand = check_int(d_conv, "d_conv"), check_int(expand, "expand")
        headdim, ngroups = check_int(headdim, "headdim"), check_int(ngroups, "ngroups")
        D_in = expand * d_model
        if D_in % headdim:
            raise ValueError(f"headdim must divide d_inner = expand · d_model = {D_in}; got headdim = {headdim}")
        H = D_in // headdim
        if H % ngroups:
            raise ValueError(f"ngroups must divide the number of heads d_inner / headdim = {H}; got ngroups = {ngroups}")
        if not isinstance(A_init_range, (tuple, list)) or len(A_init_range) != 2:
            raise TypeError(f"A_init_range must be a pair (lo, hi); got {A_init_range!r}")
        a_lo = check_real(A_init_range[0], "A_init_range[0]", low=0, open_interval=True)
        a_hi = check_real(A_init_range[1], "A_init_range[1]", low=a_lo)
        lo, hi, floor = _check_steps(dt_min, dt_max, dt_init_floor)
        bias, conv_bias = _check_flag(bias, "bias"), _check_flag(conv_bias, "conv_bias")
        eps = check_real(norm_eps, "norm_eps", low=0, open_interval=True)
        self.chunk_size = check_int(chunk_size, "chunk_size")
        check_dtype(dtype)
        rng = as_generator(seed)
        self.d = self.p = self.d_model = d_model
        self.d_inner, self.d_state, self.d_conv = D_in, d_state, d_conv
        self.headdim, self.ngroups, self.nheads = headdim, ngroups, H
        self._x_rows = slice(D_in, 2 * D_in)
        conv_dim = D_in + 2 * ngroups * d_state
        self.in_proj = _linear(rng, d_model, D_in + conv_dim + H, bias, dtype)
        self.conv1d = _conv(rng, conv_dim, d_conv, conv_bias, dtype)
        self.dt_bias = torch.nn.Parameter(torch.from_numpy(_step_bias(rng, H, lo, hi, floor)).to(dtype))
        self.A_log = torch.nn.Parameter(torch.from_numpy(np.log(rng.uniform(a_lo, a_hi, size=H))).to(dtype))
        self.D = torch.nn.Parameter(torch.ones(H, dtype=dtype))
        self.norm = _GatedRMSNorm(D_in, D_in // ngroups, eps, dtype)
        self.out_proj = _linear(rng, D_in, d_model, bias, dtype)

    def _x_bias(self) -> torch.Tensor | None:
        return None if self.in_proj.bias is None else self.in_proj.bias[self._x_rows]

    def _inner(self, X: torch.Tensor):
        # z, c (x-part pre-activation), v, Δ (b, n, H), B, C (b, n, G, N) at X.
        D_in, GN = self.d_inner, self.ngroups * self.d_state
        z, xBC, dt = self.in_proj(X).split([D_in, D_in + 2 * GN, self.nheads], -1)
        pre = self._convolve(xBC)
        v, B, C = F.silu(pre).split([D_in, GN, GN], -1)
        delta = _softplus(dt + self.dt_bias)
        return z, pre[..., :D_in], v, delta, B.unflatten(-1, (self.ngroups, -1)), C.unflatten(-1, (self.ngroups, -1))

    @batched
    def forward(self, X: torch.Tensor, method: str = "auto") -> torch.Tensor:
        method = check_choice(method, "method", ("auto", "recurrence", "scan", "quadratic"))
        if method == "auto":
            method = "quadratic" if X.shape[1] <= self._QUADRATIC_UP_TO else "scan"
        z, _, v, delta, B, C = self._inner(X)
        heads = v.unflatten(-1, (self.nheads, self.headdim))
        if method == "scan":
            o = ssd_chunked(delta, -torch.exp(self.A_log), B, C, heads, chunk=self.chunk_size)
        else:
            o = {"recurrence": ssd_loop, "quadratic": ssd_quadratic}[method](delta, -torch.exp(self.A_log), B, C,
                                                                             heads)
        r = (o + self.D[:, None] * heads).flatten(-2) * F.silu(z)
        return self.out_proj(self.norm.weight * r * self.norm.inverse_rms(r))

    def _pieces(self, X: torch.Tensor):
        z, c, v, delta, B, C = self._inner(X)
        n, H = X.shape[1], self.nheads
        group = torch.arange(H) // (H // self.ngroups)
        overlap = torch.einsum("bign,bmgn->bgim", C, B)[:, group]                      # C_i·B_m, (b, H, i, m)
        decay = torch.exp(_segment_sums(delta.transpose(1, 2)) * -torch.exp(self.A_log)[:, None, None])
        causal = torch.tril(torch.ones(n, n, dtype=X.dtype))
        kappa = overlap * decay * delta.transpose(1, 2)[:, :, None, :] * causal + torch.eye(n, dtype=X.dtype) * \
            self.D[:, None, None]                                                       # (b, H, i, m)
        kappa = kappa.permute(0, 2, 3, 1).repeat_interleave(self.headdim, -1)          # (b, i, m, d_inner)
        r = torch.einsum("bimq,bmq->biq", kappa, v) * F.silu(z)                        # the gated scan output
        return kappa * torch.sigmoid(c)[:, None], self.norm.weight * self.norm.inverse_rms(r) * F.silu(z), c
