"""State space models: the LTI SSM, Mamba's selective SSM, Mamba-2's SSD, S4D's and S5's layers.

All are structured dynamics ({prf:ref}`def-structured-dynamics`): the operator comes from a
latent recurrence. An LTI model's operator is block Toeplitz in its lags L_ℓ (`lags(n)`,
shape (n, p, d)); the selective SSM's factors depend on the input; SSD's decay is one scalar
per head, which puts it in the factorized class too. Models with `lags` are what the head
counts of `lib.heads` take. Forward routes (`method=`) agree to rounding; "recurrence" is
the reference, "auto" picks the fastest on CPU (benchmarks/bench_forward.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import as_generator, as_tensor, check_choice, check_dtype, check_int, check_real, check_shape
from .base import SequenceMap, batched
from .operators import factorized_operator, toeplitz_operator
from .scan import (lti_chunked, lti_loop, powers_times, selective_loop, selective_scan, ssd_chunked, ssd_loop,
                   ssd_quadratic)


def _softplus(z: torch.Tensor) -> torch.Tensor:
    # torch returns z itself above its default threshold 20 (an error e^-20 in Δ); 40 is below rounding.
    return F.softplus(z, threshold=40.0)


def _random_steps(rng: np.random.Generator, step_range: Any, size: int) -> np.ndarray:
    """Steps log-uniform in step_range = (lo, hi), 0 < lo <= hi (Mamba's and S4D's Δ init)."""
    if not isinstance(step_range, (tuple, list)) or len(step_range) != 2:
        raise TypeError(f"step_range must be a pair (lo, hi); got {step_range!r}")
    lo = check_real(step_range[0], "step_range[0]", low=0, open_interval=True)
    hi = check_real(step_range[1], "step_range[1]", low=lo)
    return np.exp(rng.uniform(np.log(lo), np.log(hi), size=size))


def _step_biases(rng: np.random.Generator, step_range: Any, size: int) -> np.ndarray:
    step = _random_steps(rng, step_range, size)
    return step + np.log(-np.expm1(-step))  # softplus⁻¹: softplus(bias) = step


def _segment_sums(x: torch.Tensor) -> torch.Tensor:
    """S[..., i, j] = Σ_{t=j+1}^{i} x[..., t] for j <= i, 0 above; time last. Summed per
    segment, not as differences of a running sum, so long sequences keep their digits."""
    n = x.shape[-1]
    below = torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1)
    terms = torch.where(below, x[..., :, None], torch.zeros((), dtype=x.dtype))  # [t, j] = x_t if t > j
    return torch.tril(torch.cumsum(terms, dim=-2))


class LinearSSM(SequenceMap):
    """s_i = A s_{i−1} + B x_i, y_i = C s_i, s_{−1} = 0; A (N, N), B (N, d), C (p, N).

    {prf:ref}`def-lti-ssm`, {prf:ref}`prop-lti-ssm`: 𝒲_ij = L_{i−j} = C A^{i−j} B for j <= i.
    Routes: "recurrence"; "scan" (chunks of 64 steps, lib.scan); "auto" (recurrence up to n = 256).
    """

    _RECURRENCE_UP_TO = 256

    def __init__(self, A: Any, B: Any, C: Any, *, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, A=(A, "N N"), B=(B, "N d"), C=(C, "p N"))
        self.d, self.p, self.N = dims["d"], dims["p"], dims["N"]

    @classmethod
    def random(cls, N: int, d: int, p: int, *, spectral_radius: float = 0.9, seed: Any = 0,
               dtype: torch.dtype = torch.float64) -> "LinearSSM":
        """A Gaussian rescaled to the spectral radius; B, C with iid N(0, 1/fan-in) entries."""
        N, d, p = check_int(N, "N"), check_int(d, "d"), check_int(p, "p")
        radius = check_real(spectral_radius, "spectral_radius", low=0)
        rng = as_generator(seed)
        A = rng.standard_normal((N, N))
        A *= radius / max(np.abs(np.linalg.eigvals(A)).max(), 1e-300)
        B = rng.standard_normal((N, d)) / np.sqrt(d)
        return cls(A, B, rng.standard_normal((p, N)) / np.sqrt(N), dtype=dtype)

    @classmethod
    def diagonal(cls, eigenvalues: Any, B: Any, C: Any, *, dtype: torch.dtype = torch.float64) -> "LinearSSM":
        """A with the given eigenvalues (N,), in real block-diagonal form: λ real is a 1×1
        block, a pair a ± ib the block [[a, −b], [b, a]] (pairs listed twice, closed under
        conjugation; blocks in order of first appearance). B (N, d), C (p, N)."""
        lam = np.asarray(eigenvalues.numpy(force=True) if isinstance(eigenvalues, torch.Tensor) else eigenvalues)
        if lam.dtype.kind not in "iufc":
            raise TypeError(f"eigenvalues must be real or complex numbers; got {lam.dtype}")
        if lam.ndim != 1 or lam.size == 0 or not np.isfinite(lam).all():
            raise ValueError(f"eigenvalues must be a finite array of shape (N,); got {lam!r}")
        A, free, k = np.zeros((lam.size, lam.size)), list(range(lam.size)), 0
        while free:
            value = complex(lam[free.pop(0)])
            if value.imag == 0:
                A[k, k], k = value.real, k + 1
                continue
            partner = next((m for m in free if np.isclose(lam[m], value.conjugate(), rtol=1e-12, atol=0)), None)
            if partner is None:
                raise ValueError(f"eigenvalues must be closed under conjugation; {value} has no partner")
            free.remove(partner)
            A[k:k + 2, k:k + 2] = [[value.real, -abs(value.imag)], [abs(value.imag), value.real]]
            k += 2
        return cls(A, B, C, dtype=dtype)

    @classmethod
    def damped_rotation(cls, radius: float, angle: float, *, dtype: torch.dtype = torch.float64) -> "LinearSSM":
        """N = d = p = 2, A = radius · R(angle), B = C = I: lags radius^ℓ R(ℓ·angle), which span
        span{I, R(π/2)} unless angle is a multiple of π."""
        radius, angle = check_real(radius, "radius", low=0), check_real(angle, "angle")
        A = radius * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        return cls(A, np.eye(2), np.eye(2), dtype=dtype)

    @classmethod
    def from_continuous(cls, A_c: Any, B_c: Any, C_c: Any, step: float, method: str = "bilinear", *,
                        dtype: torch.dtype = torch.float64) -> "LinearSSM":
        """Discretise ṡ = A_c s + B_c x, y = C_c s with step Δ ({prf:ref}`prop-discretisation`).

        "bilinear" (S4): A = (I − Δ/2 A_c)⁻¹(I + Δ/2 A_c), B = (I − Δ/2 A_c)⁻¹ Δ B_c; undefined
        when 2/Δ is an eigenvalue of A_c (ValueError). "zoh" (Mamba): A = exp(Δ A_c),
        B = Δ φ₁(Δ A_c) B_c, for every A_c (singular too), from the exponential of
        Δ [[A_c, B_c], [0, 0]]. A_c (N, N), B_c (N, d), C_c (p, N), Δ > 0.
        """
        check_dtype(dtype)
        dims: dict[str, int] = {}
        A_c, B_c, C_c = (as_tensor(v, name, dtype) for v, name in ((A_c, "A_c"), (B_c, "B_c"), (C_c, "C_c")))
        for tensor, name, shape in ((A_c, "A_c", "N N"), (B_c, "B_c", "N d"), (C_c, "C_c", "p N")):
            check_shape(tensor, name, shape, dims)
        step = check_real(step, "step", low=0, open_interval=True)
        method = check_choice(method, "method", ("bilinear", "zoh"))
        N, d = dims["N"], dims["d"]
        eye = torch.eye(N, dtype=dtype)
        if method == "bilinear":
            left = eye - step / 2 * A_c
            if torch.linalg.matrix_rank(left.detach()) < N:
                raise ValueError(f"A_c has the eigenvalue 2/step = {2 / step:g}: the bilinear rule is "
                                 "undefined; use another step or method='zoh'")
            return cls(torch.linalg.solve(left, eye + step / 2 * A_c), torch.linalg.solve(left, step * B_c),
                       C_c, dtype=dtype)
        block = torch.cat([torch.cat([A_c, B_c], 1), torch.zeros(d, N + d, dtype=dtype)], 0)
        # For one small matrix torch takes a degree-8 Taylor path with a wrong x^7 coefficient
        # (pytorch/pytorch#196592: errors ~1e-12); a batch of two always takes the degree-18 path.
        top = torch.linalg.matrix_exp(torch.stack([step * block] * 2))[0, :N]
        return cls(top[:, :N], top[:, N:], C_c, dtype=dtype)

    @property
    def spectral_radius(self) -> float:
        """ρ(A): the lags decay like ρ^ℓ when ρ < 1."""
        return float(torch.linalg.eigvals(self.A.detach()).abs().max())

    def lags(self, n: int) -> torch.Tensor:
        """L_ℓ = C A^ℓ B for ℓ = 0..n−1, shape (n, p, d), by doubling."""
        return self.C @ powers_times(self.A, self.B, check_int(n, "n"))

    @batched
    def forward(self, X: torch.Tensor, method: str = "auto") -> torch.Tensor:
        method = check_choice(method, "method", ("auto", "recurrence", "scan"))
        loop = method == "recurrence" or (method == "auto" and X.shape[1] <= self._RECURRENCE_UP_TO)
        return (lti_loop if loop else lti_chunked)(self.A, self.B, self.C, X)

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        return toeplitz_operator(self.lags(n), n).expand(b, n, n, self.p, self.d)


class SelectiveSSM(SequenceMap):
    """Mamba's selective SSM (S6) as in mamba_ssm's `selective_scan_ref`; p = d channels q:

        Δ_t = softplus(W_Δ x_t + dt_bias),  B_t = W_B x_t,  C_t = W_C x_t ∈ ℝ^N,
        s_t[q] = exp(Δ_t[q] A[q]) ⊙ s_{t−1}[q] + Δ_t[q] B_t x_t[q],  y_t[q] = ⟨C_t, s_t[q]⟩,

    A = −exp(A_log) (d, N); W_Δ (d, d), dt_bias (d,), W_B, W_C (N, d).
    {prf:ref}`prop-selective-ssm`: 𝒲_ij(X) is diagonal, 𝒲_ij[q, q] = C_iᵀ(Π_{t=j+1}^{i}
    exp(Δ_t[q] A[q])) ⊙ Δ_j[q] B_j. Deviations from the Mamba block: no conv, z gate, D skip
    or in/out projections; W_Δ is full rank (Mamba's is low rank).
    Routes: "recurrence"; "scan" (a chunked two-pass scan, lib.scan); "auto" (scan from n = 64).
    """

    _SCAN_FROM = 64

    def __init__(self, A_log: Any, W_delta: Any, dt_bias: Any, W_B: Any, W_C: Any, *,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, A_log=(A_log, "d N"), W_delta=(W_delta, "d d"),
                                   dt_bias=(dt_bias, "d"), W_B=(W_B, "N d"), W_C=(W_C, "N d"))
        self.d = self.p = dims["d"]
        self.N = dims["N"]

    @classmethod
    def random(cls, d: int, N: int = 8, *, step_range: tuple[float, float] = (1e-3, 1e-1), seed: Any = 0,
               dtype: torch.dtype = torch.float64) -> "SelectiveSSM":
        """Mamba's init: A[q] = −(1, …, N), softplus(dt_bias) log-uniform in step_range;
        W_Δ, W_B, W_C with iid N(0, 1/d) entries."""
        d, N = check_int(d, "d"), check_int(N, "N")
        rng = as_generator(seed)
        A_log = np.log(np.tile(np.arange(1, N + 1, dtype=float), (d, 1)))
        dt_bias = _step_biases(rng, step_range, d)
        W_delta, W_B, W_C = (rng.standard_normal(shape) / np.sqrt(d) for shape in ((d, d), (N, d), (N, d)))
        return cls(A_log, W_delta, dt_bias, W_B, W_C, dtype=dtype)

    @batched
    def selection(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(Δ (b, n, d), B (b, n, N), C (b, n, N)) at X."""
        return _softplus(X @ self.W_delta.T + self.dt_bias), X @ self.W_B.T, X @ self.W_C.T

    @batched
    def forward(self, X: torch.Tensor, method: str = "auto") -> torch.Tensor:
        method = check_choice(method, "method", ("auto", "recurrence", "scan"))
        delta, B, C = self.selection(X)
        loop = method == "recurrence" or (method == "auto" and X.shape[1] < self._SCAN_FROM)
        return (selective_loop if loop else selective_scan)(delta, -torch.exp(self.A_log), B, C, X)

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        delta, B, C = self.selection(X)
        n = X.shape[1]
        elapsed = _segment_sums(delta.transpose(1, 2)).permute(0, 2, 3, 1)  # Σ_{t=j+1}^{i} Δ_t, (b, i, j, d)
        decay = torch.exp(elapsed[..., None] * -torch.exp(self.A_log))      # (b, i, j, d, N)
        causal = torch.tril(torch.ones(n, n, dtype=X.dtype))[None, :, :, None]
        coefficient = torch.einsum("bin,bijcn,bjn->bijc", C, decay, B) * delta[:, None] * causal
        return torch.diag_embed(coefficient)


class SSD(SequenceMap):
    """Mamba-2's state space duality layer: H heads of d/H channels, one scalar decay per head.

    With Δ_t^h = softplus(w_Δ^h · x_t + dt_bias_h), a_t^h = exp(−Δ_t^h exp(A_log_h)) and
    B_t = W_B x_t, C_t = W_C x_t ∈ ℝ^N shared by the heads (one group):

        s_t^h = a_t^h s_{t−1}^h + Δ_t^h B_t x_t^{(h)ᵀ},   y_t = W_O concat_h((s_t^h)ᵀ C_t).

    {prf:ref}`prop-ssd`: 𝒲_ij(X) = Σ_h (C_i·B_j) Δ_j^h Π_{t=j+1}^{i} a_t^h · W_O P_h (j <= i),
    P_h keeping head h's channels: the factorized class with V_h = W_O P_h.
    Parameters A_log (H,), W_delta (H, d), dt_bias (H,), W_B, W_C (N, d), W_O (p, d).
    Deviations from the Mamba-2 block: no D skip, gate or norm, no conv or in-projection.
    Routes: "recurrence"; "scan" (chunks of 32); "quadratic" (the dual form); "auto"
    (quadratic up to n = 64).
    """

    _QUADRATIC_UP_TO = 64

    def __init__(self, A_log: Any, W_delta: Any, dt_bias: Any, W_B: Any, W_C: Any, W_O: Any, *,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, A_log=(A_log, "H"), W_delta=(W_delta, "H d"), dt_bias=(dt_bias, "H"),
                                   W_B=(W_B, "N d"), W_C=(W_C, "N d"), W_O=(W_O, "p d"))
        if dims["d"] % dims["H"]:
            raise ValueError(f"A_log must have shape (H,) with H dividing d = {dims['d']}; got H = {dims['H']}")
        self.d, self.p, self.N, self.H = dims["d"], dims["p"], dims["N"], dims["H"]

    @classmethod
    def random(cls, d: int, p: int, N: int = 8, heads: int = 1, *, step_range: tuple[float, float] = (1e-3, 1e-1),
               seed: Any = 0, dtype: torch.dtype = torch.float64) -> "SSD":
        """exp(A_log) ~ U(1, 16) as in Mamba-2, softplus(dt_bias) log-uniform in step_range;
        W_Δ, W_B, W_C, W_O with iid N(0, 1/d) entries."""
        d, p, N, heads = check_int(d, "d"), check_int(p, "p"), check_int(N, "N"), check_int(heads, "heads")
        rng = as_generator(seed)
        A_log = np.log(rng.uniform(1, 16, size=heads))
        dt_bias = _step_biases(rng, step_range, heads)
        W_delta, W_B, W_C, W_O = (rng.standard_normal(shape) / np.sqrt(d)
                                  for shape in ((heads, d), (N, d), (N, d), (p, d)))
        return cls(A_log, W_delta, dt_bias, W_B, W_C, W_O, dtype=dtype)

    def values(self) -> torch.Tensor:
        """V_h = W_O P_h (W_O on head h's channels), shape (H, p, d)."""
        head = torch.arange(self.d) // (self.d // self.H)
        P = (head[None, :] == torch.arange(self.H)[:, None]).to(self.W_O.dtype)  # (H, d)
        return self.W_O[None] * P[:, None, :]

    def _steps(self, X: torch.Tensor) -> torch.Tensor:
        return _softplus(X @ self.W_delta.T + self.dt_bias)  # Δ_t^h, (b, n, H)

    @batched
    def forward(self, X: torch.Tensor, method: str = "auto") -> torch.Tensor:
        method = check_choice(method, "method", ("auto", "recurrence", "scan", "quadratic"))
        if method == "auto":
            method = "quadratic" if X.shape[1] <= self._QUADRATIC_UP_TO else "scan"
        route = {"recurrence": ssd_loop, "scan": ssd_chunked, "quadratic": ssd_quadratic}[method]
        heads = route(self._steps(X), -torch.exp(self.A_log), X @ self.W_B.T, X @ self.W_C.T,
                      X.unflatten(-1, (self.H, -1)))  # (b, n, H, d/H)
        return heads.flatten(-2) @ self.W_O.T

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        delta = self._steps(X).transpose(1, 2)                                            # (b, H, n)
        decay = torch.exp(_segment_sums(delta) * -torch.exp(self.A_log)[:, None, None])  # (b, H, i, j)
        causal = torch.tril(torch.ones(n, n, dtype=X.dtype))
        overlap = (X @ self.W_C.T) @ (X @ self.W_B.T).transpose(1, 2)                    # C_i·B_j
        return factorized_operator(overlap[:, None] * decay * delta[:, :, None, :] * causal, self.values())


# -- S4D's and S5's layers: diagonal continuous dynamics, ZOH with a learned step, a skip D --------


class _ModalSSM(SequenceMap):
    """An LTI layer (p = d) with modes λ_c = −exp(A_log) + i A_imag (A_imag absent: real modes),
    steps Δ = exp(log_dt), λ = e^{Δλ_c} and B̄ = (e^{Δλ_c} − 1)/λ_c · B (expm1: small Δλ_c keep
    their digits). Complex modes stand for conjugate pairs, read out as 2 Re(·).
    Routes: "recurrence" (the complex state, the reference) and "convolution" ("auto").
    """

    complex = True

    def _discretise(self, log_dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Δλ and (e^{Δλ} − 1)/λ, complex when the layer has complex modes.
        lam = -torch.exp(self.A_log)
        if self.complex:
            lam = torch.complex(lam, self.A_imag)
        step_lam = torch.exp(log_dt) * lam
        return step_lam, torch.expm1(step_lam) / lam

    def _readout(self, z: torch.Tensor) -> torch.Tensor:
        return 2 * z.real if self.complex else z

    @batched
    def forward(self, X: torch.Tensor, method: str = "auto") -> torch.Tensor:
        method = check_choice(method, "method", ("auto", "recurrence", "convolution"))
        return self._recurrence(X) if method == "recurrence" else self._convolution(X)

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        return toeplitz_operator(self.lags(n), n).expand(b, n, n, self.p, self.d)

    def modes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Nodes ν_k (K,) and residues R_k (K, p, d), complex128, with L_ℓ = Σ_k ν_k^ℓ R_k (0⁰ = 1).

        One node λ per mode (and λ̄ with R̄ for a complex one), and the node 0 with residue diag(D).
        """
        nodes, residues = self._modes_and_residues()
        if self.complex:
            nodes, residues = torch.cat([nodes, nodes.conj()]), torch.cat([residues, residues.conj()])
        nodes = torch.cat([nodes, torch.zeros(1, dtype=nodes.dtype)])
        residues = torch.cat([residues, torch.diag(self.D).to(residues.dtype)[None]])
        return nodes.detach().to(torch.complex128), residues.detach().to(torch.complex128)


def _s4d_modes(shape: tuple[int, ...], M: int, init: str) -> tuple[np.ndarray, np.ndarray]:
    # A_log, A_imag of S4D-Lin (λ = −½ + iπm, m = 0..M−1) or S4D-Real (λ = −(m+1), A_imag = 0).
    m = np.broadcast_to(np.arange(M, dtype=float), (*shape, M))
    if init == "lin":
        return np.full((*shape, M), np.log(0.5)), np.pi * m
    return np.log(m + 1.0), np.zeros((*shape, M))


class DiagonalSSM(_ModalSSM):
    """S4D's layer (Gu et al. 2022): d single-channel SSMs with M diagonal modes, a step each, a skip D.

    Channel q: λ_qm = e^{Δ_q λc_qm}, B̄_qm = (λ_qm − 1)/λc_qm and the kernel

        K[q, ℓ] = 2 Re Σ_m C_qm B̄_qm λ_qm^ℓ (complex, C = C[..., 0] + i C[..., 1], N = 2M),
        K[q, ℓ] = Σ_m C_qm B̄_qm λ_qm^ℓ (real: no A_imag, C (d, M), N = M);

    y_i[q] = Σ_{ℓ<=i} K[q, ℓ] x_{i−ℓ}[q] + D_q x_i[q]: lags L_ℓ = diag(K[:, ℓ]) + δ_ℓ0 diag(D).
    Parameters log_dt (d,), A_log (d, M), A_imag (d, M) or None, C (d, M, 2) or (d, M), D (d,).
    """

    def __init__(self, log_dt: Any, A_log: Any, C: Any, D: Any, A_imag: Any = None, *,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.complex = A_imag is not None
        modes = {"A_imag": (A_imag, "d M")} if self.complex else {}
        dims = self.set_parameters(dtype, log_dt=(log_dt, "d"), A_log=(A_log, "d M"), D=(D, "d"),
                                   C=(C, "d M 2" if self.complex else "d M"), **modes)
        self.d = self.p = dims["d"]
        self.M = dims["M"]
        self.N = 2 * self.M if self.complex else self.M

    @classmethod
    def random(cls, d: int, N: int, *, init: str = "lin", step_range: tuple[float, float] = (1e-3, 1e-1),
               seed: Any = 0, dtype: torch.dtype = torch.float64) -> "DiagonalSSM":
        """S4D's init with state size N per channel: "lin", M = N/2 modes −½ + iπm, E|C_qm|² = 1;
        "real", M = N modes −(m+1), C ~ N(0, 1). log Δ uniform in log step_range; D ~ N(0, 1)."""
        d, N = check_int(d, "d"), check_int(N, "N")
        init = check_choice(init, "init", ("lin", "real"))
        if init == "lin" and N % 2:
            raise ValueError(f"N must be even for init='lin' (N/2 complex modes); got N = {N}")
        M = N // 2 if init == "lin" else N
        rng = as_generator(seed)
        log_dt = np.log(_random_steps(rng, step_range, d))
        A_log, A_imag = _s4d_modes((d,), M, init)
        C = rng.standard_normal((d, M, 2)) * np.sqrt(0.5) if init == "lin" else rng.standard_normal((d, M))
        return cls(log_dt, A_log, C, rng.standard_normal(d), A_imag if init == "lin" else None, dtype=dtype)

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        # Δλ (d, M) and C B̄ (d, M).
        step_lam, factor = self._discretise(self.log_dt[:, None])
        C = torch.complex(self.C[..., 0], self.C[..., 1]) if self.complex else self.C
        return step_lam, C * factor

    def _modes_and_residues(self) -> tuple[torch.Tensor, torch.Tensor]:
        step_lam, CB = self._weights()                                  # mode (q, m): (CB)_qm E_qq
        E = torch.diag_embed(torch.eye(self.d, dtype=CB.dtype))
        return torch.exp(step_lam).reshape(-1), (CB[..., None, None] * E[:, None]).reshape(-1, self.d, self.d)

    def kernel(self, n: int) -> torch.Tensor:
        """K[q, ℓ] for ℓ = 0..n−1 (without D), shape (d, n)."""
        step_lam, CB = self._weights()
        ell = torch.arange(check_int(n, "n"), dtype=self.dtype)
        return self._readout(torch.einsum("qm,qml->ql", CB, torch.exp(step_lam[..., None] * ell)))

    def lags(self, n: int) -> torch.Tensor:
        """L_ℓ for ℓ = 0..n−1, shape (n, d, d) (diagonal)."""
        lags = torch.diag_embed(self.kernel(n).T)
        return torch.cat([lags[:1] + torch.diag(self.D), lags[1:]])

    def _convolution(self, X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        return torch.einsum("ijq,bjq->biq", toeplitz_operator(self.kernel(n).T, n), X) + self.D * X

    def _recurrence(self, X: torch.Tensor) -> torch.Tensor:
        step_lam, CB = self._weights()
        mu, s, outputs = torch.exp(step_lam), None, []
        for x in X.unbind(1):                                   # s_i = λ s_{i−1} + x_i, per channel and mode
            s = x[..., None].to(mu.dtype) if s is None else mu * s + x[..., None]
            outputs.append(self._readout((CB * s).sum(-1)) + self.D * x)
        return torch.stack(outputs, 1)


class SharedStateSSM(_ModalSSM):
    """S5's layer (Smith et al. 2023): M diagonal modes shared by the d channels, a step each, a skip D.

    λ_m = e^{Δ_m λc_m}, B̄_m = (λ_m − 1)/λc_m B_m, complex B (M, d) and C (d, M) (last axis: real,
    imaginary part), conjugate pairs read out as 2 Re; state size N = 2M (S5's P):

        L_ℓ = 2 Re Σ_m C[:, m] λ_m^ℓ B̄_m + δ_ℓ0 diag(D).

    Parameters log_dt, A_log, A_imag (M,), B (M, d, 2), C (d, M, 2), D (d,).
    Deviations from S5: S4D-Lin eigenvalues rather than HiPPO-N's; a convolution instead of a
    parallel scan (the same map).
    """

    def __init__(self, log_dt: Any, A_log: Any, A_imag: Any, B: Any, C: Any, D: Any, *,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, log_dt=(log_dt, "M"), A_log=(A_log, "M"), A_imag=(A_imag, "M"),
                                   B=(B, "M d 2"), C=(C, "d M 2"), D=(D, "d"))
        self.d = self.p = dims["d"]
        self.M, self.N = dims["M"], 2 * dims["M"]

    @classmethod
    def random(cls, d: int, N: int, *, step_range: tuple[float, float] = (1e-3, 1e-1), seed: Any = 0,
               dtype: torch.dtype = torch.float64) -> "SharedStateSSM":
        """N states (even): S4D-Lin modes −½ + iπm, m < N/2; E|B|² = 1/d, E|C|² = 2/N per entry;
        log Δ_m uniform in log step_range; D ~ N(0, 1)."""
        d, N = check_int(d, "d"), check_int(N, "N")
        if N % 2:
            raise ValueError(f"N must be even (N/2 complex modes); got N = {N}")
        M, rng = N // 2, as_generator(seed)
        log_dt = np.log(_random_steps(rng, step_range, M))
        A_log, A_imag = _s4d_modes((), M, "lin")
        B = rng.standard_normal((M, d, 2)) * np.sqrt(0.5 / d)
        C = rng.standard_normal((d, M, 2)) * np.sqrt(0.5 / M)
        return cls(log_dt, A_log, A_imag, B, C, rng.standard_normal(d), dtype=dtype)

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Δλ (M,), B̄ (M, d), C (d, M), complex.
        step_lam, factor = self._discretise(self.log_dt)
        B = torch.complex(self.B[..., 0], self.B[..., 1]) * factor[:, None]
        return step_lam, B, torch.complex(self.C[..., 0], self.C[..., 1])

    def _modes_and_residues(self) -> tuple[torch.Tensor, torch.Tensor]:
        step_lam, B, C = self._weights()                                # mode m: C[:, m] B̄_m
        return torch.exp(step_lam), torch.einsum("pm,md->mpd", C, B)

    def lags(self, n: int) -> torch.Tensor:
        """L_ℓ for ℓ = 0..n−1, shape (n, d, d)."""
        step_lam, B, C = self._weights()
        ell = torch.arange(check_int(n, "n"), dtype=self.dtype)
        lags = self._readout(torch.einsum("pm,ml,md->lpd", C, torch.exp(step_lam[:, None] * ell), B))
        return torch.cat([lags[:1] + torch.diag(self.D), lags[1:]])

    def _convolution(self, X: torch.Tensor) -> torch.Tensor:
        step_lam, B, C = self._weights()
        n = X.shape[1]
        powers = torch.exp(step_lam[None, :] * torch.arange(n, dtype=self.dtype)[:, None])
        states = torch.einsum("ijm,bjm->bim", toeplitz_operator(powers, n), X.to(B.dtype) @ B.T)
        return self._readout(states @ C.T) + self.D * X

    def _recurrence(self, X: torch.Tensor) -> torch.Tensor:
        step_lam, B, C = self._weights()
        mu, s, outputs = torch.exp(step_lam), None, []
        for x in X.unbind(1):                                   # s_i = λ ⊙ s_{i−1} + B̄ x_i
            u = x.to(B.dtype) @ B.T
            s = u if s is None else mu * s + u
            outputs.append(self._readout(s @ C.T) + self.D * x)
        return torch.stack(outputs, 1)


# -- S4D-style LTI SSMs with a chosen spectral radius ---------------------------------------------


def s4d_continuous(N: int, d: int, *, init: str = "lin", p: int | None = None,
                   seed: Any = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A_c (N, N), B_c (N, d), C (p, N)) of `s4d_ssm`, float64 numpy.

    "lin": blocks [[−½, −πm], [πm, −½]], m = 1..⌊N/2⌋, plus −½ if N is odd; "real":
    diag(−1, …, −N). B_c, C with iid N(0, 1/d), N(0, 1/N) entries (default_rng(seed)); p = d by default.
    """
    N, d = check_int(N, "N"), check_int(d, "d")
    p = d if p is None else check_int(p, "p")
    if check_choice(init, "init", ("lin", "real")) == "lin":
        A_c, k = np.diag(np.full(N, -0.5)), np.arange(0, N - 1, 2)       # block k/2 has m = k/2 + 1
        A_c[k, k + 1], A_c[k + 1, k] = -math.pi * (k // 2 + 1), math.pi * (k // 2 + 1)
    else:
        A_c = np.diag(-np.arange(1.0, N + 1))
    rng = as_generator(seed)
    B_c = rng.standard_normal((N, d)) / math.sqrt(d)
    return A_c, B_c, rng.standard_normal((p, N)) / math.sqrt(N)


def s4d_step(spectral_radius: float, init: str = "lin") -> float:
    """The ZOH step Δ that gives `s4d_ssm` the spectral radius ρ ∈ (0, 1): −2 ln ρ ("lin"), −ln ρ ("real")."""
    rho = check_real(spectral_radius, "spectral_radius", low=0, high=1, open_interval=True)
    return (-2 if check_choice(init, "init", ("lin", "real")) == "lin" else -1) * math.log(rho)


def s4d_ssm(N: int, d: int, spectral_radius: float, *, init: str = "lin", p: int | None = None,
            seed: Any = 0, dtype: torch.dtype = torch.float64) -> LinearSSM:
    """An S4D-style LinearSSM with ρ(A) = spectral_radius: `s4d_continuous` by ZOH, step `s4d_step`.

    S4D-Lin or S4D-Real eigenvalues (Gu et al. 2022) in real block form: ρ sets the step, and
    n steps sample the impulse response over T = nΔ. A dense LTI SSM, not S4D's layer
    (`DiagonalSSM`): the lin modes start at m = 1 (a real pair would repeat an eigenvalue), no D.
    """
    A_c, B_c, C = s4d_continuous(N, d, init=init, p=p, seed=seed)
    return LinearSSM.from_continuous(A_c, B_c, C, s4d_step(spectral_radius, init), "zoh", dtype=dtype)
