"""State space models: the linear time-invariant SSM, Mamba's selective SSM, Mamba-2's SSD.

All three are Structured Dynamics ({prf:ref}`def-structured-dynamics`): the operator
is induced by a latent recurrence.  For the LTI SSM it is block Toeplitz in the lag
operators L_ℓ = C A^ℓ B; for the selective SSM the factors A_t, B_t, C_t depend on
the input; for SSD the decay is a scalar per head, which puts SSD in the factorized
class as well.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ._scan import selective_loop, selective_scan, ssd_chunked, ssd_loop, ssd_quadratic
from ._validation import as_parameter, check_choice, check_int, check_real, resolve_dtype
from .base import SequenceMap, exposed
from .factorized import factorized_operator
from .operators import _toeplitz


def _powers_times(A: torch.Tensor, M: torch.Tensor, n: int) -> torch.Tensor:
    """A^ℓ M for ℓ = 0..n−1, shape (n, N, k), by doubling: O(log n) large matrix products."""
    N, k = M.shape
    out = M[:, None, :]  # (N, m, k) holds A^ℓ M for ℓ < m
    power = A            # A^m
    while out.shape[1] < n:
        m = out.shape[1]
        out = torch.cat([out, (power @ out.reshape(N, m * k)).reshape(N, m, k)], 1)
        if out.shape[1] < n:
            power = power @ power
    return out[:, :n].permute(1, 0, 2)


def _softplus(z: torch.Tensor) -> torch.Tensor:
    # torch returns z itself above its default threshold 20 (an error e^-20 in Δ); at 40 it is below rounding.
    return F.softplus(z, threshold=40.0)


def _random_step_biases(rng: np.random.Generator, step_range: Any, size: int) -> np.ndarray:
    """Biases b with softplus(b) log-uniform in step_range (Mamba's Δ initialisation)."""
    if not isinstance(step_range, (tuple, list)) or len(step_range) != 2:
        raise TypeError(f"step_range must be a pair (lo, hi); got {step_range!r}")
    lo = check_real(step_range[0], "step_range[0]", positive=True)
    hi = check_real(step_range[1], "step_range[1]", positive=True)
    step = np.exp(rng.uniform(np.log(lo), np.log(hi), size=size))
    return step + np.log(-np.expm1(-step))  # inverse of softplus


class _Routed(SequenceMap):
    """A sequence map with several forward routes that agree; "recurrence" is the reference."""

    METHODS: tuple[str, ...] = ("auto", "recurrence", "scan")

    def forward(self, X: Any, method: str = "auto") -> torch.Tensor | np.ndarray:
        """Y = model(X) by the chosen route ("auto" picks the fastest; all agree to ~1e-12
        relative in float64 and all are differentiable)."""
        return super().forward(X, method=check_choice(method, "method", self.METHODS))


def _segment_sums(x: torch.Tensor) -> torch.Tensor:
    """S[..., i, j] = Σ_{t=j+1}^{i} x[..., t] for j ≤ i, 0 for j > i; x has time last.

    Summed segment by segment (not as differences of a running sum), so the
    result stays accurate on long sequences.
    """
    n = x.shape[-1]
    strictly_lower = torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1)
    terms = torch.where(strictly_lower, x[..., :, None], torch.zeros((), dtype=x.dtype))  # [t, j] = x_t if t > j
    return torch.tril(torch.cumsum(terms, dim=-2))


class LinearSSM(_Routed):
    """A linear time-invariant state space model: s_i = A s_{i−1} + B x_i, y_i = C s_i, s_{−1} = 0.

    Implements {prf:ref}`def-lti-ssm` and {prf:ref}`prop-lti-ssm`: the operator is
    block Toeplitz, 𝒲_ij = L_{i−j} for j ≤ i and 0 for j > i, built from the lag
    operators ({prf:ref}`def-lti-ssm`)

        L_ℓ = C A^ℓ B ∈ ℝ^{p×d},   ℓ = 0, 1, 2, …

    Forward routes (``model(X, method=...)``): "recurrence" (the reference loop), "scan"
    (chunks of 64 steps: a convolution with the lags inside each chunk, a loop carrying the
    state across chunks), "auto" (recurrence for n <= 256, scan beyond: faster on CPU).

    Args:
        A: shape (N, N).  B: shape (N, d).  C: shape (p, N).
    """

    _CHUNK = 64
    _RECURRENCE_UP_TO = 256
    time_invariant = True  # an LTI map with lags `_lags(n)`: lib.heads accepts it

    def __init__(self, A: Any, B: Any, C: Any, *, dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        dims = self._set_parameters(A=(A, ("N", "N")), B=(B, ("N", "d")), C=(C, ("p", "N")))
        self.d, self.p, self.N = dims["d"], dims["p"], dims["N"]

    # -- constructors -------------------------------------------------------

    @classmethod
    def random(cls, N: int, d: int, p: int, *, spectral_radius: float = 0.9, seed: Any = 0,
               dtype: Any = torch.float64) -> "LinearSSM":
        """A Gaussian rescaled to the given spectral radius; B, C with iid N(0, 1/fan-in) entries."""
        N, d, p = check_int(N, "N"), check_int(d, "d"), check_int(p, "p")
        radius = check_real(spectral_radius, "spectral_radius", nonnegative=True)
        rng = np.random.default_rng(seed)
        A = rng.standard_normal((N, N))
        A *= radius / max(np.abs(np.linalg.eigvals(A)).max(), 1e-300)
        B = rng.standard_normal((N, d)) / np.sqrt(d)
        C = rng.standard_normal((p, N)) / np.sqrt(N)
        return cls(A, B, C, dtype=dtype)

    @classmethod
    def diagonal(cls, eigenvalues: Any, B: Any, C: Any, *, dtype: Any = torch.float64) -> "LinearSSM":
        """An SSM whose A has the given eigenvalues, in real block-diagonal form.

        A real eigenvalue λ is a 1×1 block; a complex pair a ± ib is the real
        rotation-scaling block [[a, −b], [b, a]], so A, B, C stay real.

        Args:
            eigenvalues: shape (N,), real or complex; closed under conjugation
                (each pair listed twice, in any order; blocks follow the order of
                first appearance).
            B: shape (N, d).
            C: shape (p, N).
        """
        if isinstance(eigenvalues, torch.Tensor):
            eigenvalues = eigenvalues.detach().cpu().numpy()
        if isinstance(eigenvalues, (str, bytes)) or not isinstance(eigenvalues, (np.ndarray, list, tuple)):
            raise TypeError("eigenvalues must be an array of real or complex numbers; "
                            f"got {type(eigenvalues).__name__}")
        lam = np.asarray(eigenvalues)
        if lam.dtype.kind not in "iufc":
            raise TypeError(f"eigenvalues must be an array of real or complex numbers; got dtype {lam.dtype}")
        if lam.ndim != 1 or lam.size == 0:
            raise ValueError(f"eigenvalues must have shape (N,) with N >= 1; got {lam.shape}")
        if not np.all(np.isfinite(lam)):
            raise ValueError("eigenvalues must be finite")
        lam = lam.astype(complex)
        N = lam.size
        A = np.zeros((N, N))
        used = np.zeros(N, dtype=bool)
        k = 0  # next free row of A
        for i, value in enumerate(lam):
            if used[i]:
                continue
            used[i] = True
            if value.imag == 0:
                A[k, k] = value.real
                k += 1
                continue
            partners = [m for m in range(N)
                        if not used[m] and np.isclose(lam[m], value.conjugate(), rtol=1e-12, atol=0)]
            if not partners:
                raise ValueError(f"eigenvalues must be closed under complex conjugation; {value} has no partner")
            used[partners[0]] = True
            A[k:k + 2, k:k + 2] = [[value.real, -abs(value.imag)], [abs(value.imag), value.real]]
            k += 2
        return cls(A, B, C, dtype=dtype)

    @classmethod
    def damped_rotation(cls, radius: float, angle: float, B: Any = None, C: Any = None, *,
                        dtype: Any = torch.float64) -> "LinearSSM":
        """N = 2: A = radius · R(angle), a rotation by `angle` (radians) shrunk by `radius`.

        With the default B = C = I₂ (d = p = 2) the lags are L_ℓ = radius^ℓ R(ℓ·angle),
        which span the 2-dimensional space span{I, R(π/2)} unless angle is a multiple of π.
        """
        radius = check_real(radius, "radius", nonnegative=True)
        angle = check_real(angle, "angle")
        A = radius * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        return cls(A, np.eye(2) if B is None else B, np.eye(2) if C is None else C, dtype=dtype)

    @classmethod
    def from_continuous(cls, A_c: Any, B_c: Any, C_c: Any, step: float, method: str = "bilinear", *,
                        dtype: Any = torch.float64) -> "LinearSSM":
        """Discretise ṡ = A_c s + B_c x, y = C s with step Δ ({prf:ref}`prop-discretisation`).

        bilinear (S4): A = (I − Δ/2 A_c)^{-1}(I + Δ/2 A_c),  B = (I − Δ/2 A_c)^{-1} Δ B_c;
                       defined iff 2/Δ is not an eigenvalue of A_c (ValueError naming A_c and
                       step otherwise, when I − Δ/2 A_c is numerically singular).
        zoh (Mamba):   A = exp(Δ A_c),  B = ∫_0^Δ exp(τ A_c) dτ B_c = Δ φ₁(Δ A_c) B_c with
                       φ₁(M) = Σ_k M^k/(k+1)!, defined for every A_c (singular included); it equals
                       A_c^{-1}(exp(Δ A_c) − I) B_c only when A_c is invertible.  Computed from the
                       exponential of the block matrix Δ [[A_c, B_c], [0, 0]], whose top row is [A, B].
        C is unchanged.

        Args:
            A_c: shape (N, N).  B_c: shape (N, d).  C_c: shape (p, N).
            step: Δ > 0.
            method: "bilinear" or "zoh".
        """
        dtype = resolve_dtype(dtype)
        dims: dict[str, int] = {}
        A_c = as_parameter(A_c, "A_c", ("N", "N"), dims, dtype=dtype)
        B_c = as_parameter(B_c, "B_c", ("N", "d"), dims, dtype=dtype)
        C_c = as_parameter(C_c, "C_c", ("p", "N"), dims, dtype=dtype)
        step = check_real(step, "step", positive=True)
        method = check_choice(method, "method", ("bilinear", "zoh"))
        N, d = dims["N"], dims["d"]
        identity = torch.eye(N, dtype=dtype)
        if method == "bilinear":
            left = identity - step / 2 * A_c
            if torch.linalg.matrix_rank(left.detach()) < N:
                raise ValueError(f"A_c has the eigenvalue 2/step = {2 / step:g}, so I - step/2 A_c is singular "
                                 "and the bilinear rule is undefined; use another step or method='zoh'")
            A = torch.linalg.solve(left, identity + step / 2 * A_c)
            B = torch.linalg.solve(left, step * B_c)
        else:
            block = torch.cat([torch.cat([A_c, B_c], 1), torch.zeros(d, N + d, dtype=dtype)], 0)
            # torch.linalg.matrix_exp takes, for a single matrix of small norm, a degree-8 Taylor
            # path with a wrong x^7 coefficient (pytorch/pytorch#196592: errors ~1e-12 in float64);
            # a batch of more than one matrix always takes the degree-18 path: exponentiate two copies.
            top = torch.linalg.matrix_exp(torch.stack([step * block] * 2))[0, :N]
            A, B = top[:, :N], top[:, N:]
        return cls(A, B, C_c, dtype=dtype)

    A = exposed("A", "The state matrix A, shape (N, N).")
    B = exposed("B", "The input matrix B, shape (N, d).")
    C = exposed("C", "The output matrix C, shape (p, N).")

    @property
    def spectral_radius(self) -> float:
        """ρ(A), the largest modulus of an eigenvalue of A; the lags decay like ρ^ℓ when ρ < 1."""
        return float(torch.linalg.eigvals(self._A.detach()).abs().max())

    def lags(self, n: int) -> np.ndarray:
        """L_ℓ = C A^ℓ B for ℓ = 0..n−1 ({prf:ref}`def-lti-ssm`), shape (n, p, d).

        A^ℓ B by doubling: O(N² d n) work in O(log n) batched products.
        """
        return self._lags(check_int(n, "n")).detach().cpu().numpy()

    def _lags(self, n: int) -> torch.Tensor:
        return self._C @ _powers_times(self._A, self._B, n)

    # -- forward passes -----------------------------------------------------

    def _forward(self, X: torch.Tensor, method: str = "auto") -> torch.Tensor:
        if method == "auto":
            method = "recurrence" if X.shape[1] <= self._RECURRENCE_UP_TO else "scan"
        return self._recurrence(X) if method == "recurrence" else self._scan(X)

    def _recurrence(self, X: torch.Tensor) -> torch.Tensor:
        s, states, A_T = X.new_zeros(X.shape[0], self.N), [], self._A.T
        for u in (X @ self._B.T).unbind(1):
            s = s @ A_T + u
            states.append(s)
        return torch.stack(states, 1) @ self._C.T

    def _scan(self, X: torch.Tensor) -> torch.Tensor:
        b, n, d = X.shape
        T = min(self._CHUNK, n)
        K = -(-n // T)
        chunks = F.pad(X, (0, 0, 0, K * T - n)).reshape(b, K, T, d)
        M = _powers_times(self._A, self._B, T)  # A^ℓ B, (T, N, d)
        # Inside a chunk: the convolution with L_0..L_{T−1}.
        Y = torch.einsum("tspd,bksd->bktp", _toeplitz(self._C @ M, T), chunks)
        # Across chunks: carry the state s_k = A^T s_{k−1} + Σ_t A^{T−1−t} B x_t.
        gathered = torch.einsum("tnd,bktd->bkn", M.flip(0), chunks)
        A_T = torch.linalg.matrix_power(self._A, T)
        s, entering = X.new_zeros(b, self.N), []
        for k in range(K):
            entering.append(s)
            s = s @ A_T.T + gathered[:, k]
        # The state entering a chunk reaches its t-th output through C A^{t+1}.
        readout = _powers_times(self._A.T, self._A.T @ self._C.T, T).transpose(1, 2)  # (T, p, N)
        Y = Y + torch.einsum("tpn,bkn->bktp", readout, torch.stack(entering, 1))
        return Y.reshape(b, K * T, self.p)[:, :n]

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        return _toeplitz(self._lags(n), n).expand(b, n, n, self.p, self.d)

    def _sizes(self) -> dict[str, int]:
        return {"N": self.N, **super()._sizes()}


class SelectiveSSM(_Routed):
    """Mamba's selective SSM (S6), following mamba's `selective_scan_ref`.

    For each channel q = 1..d (so p = d), with a diagonal negative A[q] ∈ ℝ^N and
    input-dependent step, input and output vectors

        Δ_t = softplus(W_Δ x_t + b_Δ) ∈ ℝ^d,   B_t = W_B x_t ∈ ℝ^N,   C_t = W_C x_t ∈ ℝ^N,
        s_t[q] = exp(Δ_t[q] A[q]) ⊙ s_{t−1}[q] + Δ_t[q] B_t x_t[q],   s_{−1} = 0,
        y_t[q] = ⟨C_t, s_t[q]⟩.

    Implements {prf:ref}`prop-selective-ssm`: 𝒲_ij(X) is diagonal in the channels,

        𝒲_ij[q, q] = C_iᵀ (Π_{t=j+1}^{i} exp(Δ_t[q] A[q])) ⊙ (Δ_j[q] B_j),   j ≤ i,

    i.e. "C_i A_i ⋯ A_{j+1} B_j" with input-dependent factors evaluated at X.
    Deviations from the Mamba block: no D skip connection, no z gate, no
    convolution or in/out projections, and a full-rank W_Δ (Mamba's is low rank).

    Forward routes (`model(X, method=...)`): "recurrence" (the reference loop over
    time), "scan" (a two-pass chunked scan with a hand-written backward, lib._scan:
    ~√n vectorised steps, forming only products of decays in (0, 1], so it is safe on
    long sequences in float32), "auto" (recurrence for n < 64, scan otherwise: the
    faster routes on CPU, benchmarks/bench_forward.py).

    Args:
        A_log: shape (d, N); A = −exp(A_log) < 0.
        W_delta: shape (d, d).   b_delta: shape (d,).
        W_B: shape (N, d).       W_C: shape (N, d).
        dtype: computation dtype (default float64).
    """

    def __init__(self, A_log: Any, W_delta: Any, b_delta: Any, W_B: Any, W_C: Any, *,
                 dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        dims = self._set_parameters(A_log=(A_log, ("d", "N")), W_delta=(W_delta, ("d", "d")),
                                    b_delta=(b_delta, ("d",)), W_B=(W_B, ("N", "d")), W_C=(W_C, ("N", "d")))
        self.d = self.p = dims["d"]
        self.N = dims["N"]

    @classmethod
    def random(cls, d: int, N: int = 8, *, step_range: tuple[float, float] = (1e-3, 1e-1), seed: Any = 0,
               dtype: Any = torch.float64) -> "SelectiveSSM":
        """Mamba's initialisation: A[q] = −(1, 2, …, N) (S4D-real), b_Δ so that
        softplus(b_Δ) is log-uniform in `step_range`; W_Δ, W_B, W_C with iid N(0, 1/d) entries."""
        d, N = check_int(d, "d"), check_int(N, "N")
        rng = np.random.default_rng(seed)
        A_log = np.log(np.tile(np.arange(1, N + 1, dtype=float), (d, 1)))
        b_delta = _random_step_biases(rng, step_range, d)
        W_delta, W_B, W_C = (rng.standard_normal(shape) / np.sqrt(d) for shape in ((d, d), (N, d), (N, d)))
        return cls(A_log, W_delta, b_delta, W_B, W_C, dtype=dtype)

    @property
    def A(self) -> np.ndarray:
        """A = −exp(A_log), shape (d, N)."""
        return (-torch.exp(self._A_log)).detach().cpu().numpy()

    A_log = exposed("A_log", "A_log, shape (d, N).")

    W_delta = exposed("W_delta", "W_Δ, shape (d, d).")

    b_delta = exposed("b_delta", "b_Δ, shape (d,).")

    W_B = exposed("W_B", "W_B, shape (N, d).")

    W_C = exposed("W_C", "W_C, shape (N, d).")

    def selection(self, X: Any) -> tuple:
        """The input-dependent (Δ_t, B_t, C_t) at X.

        Returns:
            Δ of shape (n, d), B of shape (n, N), C of shape (n, N) (with a leading
            batch axis for batched X), of the same kind as X.
        """
        return self._at_edge(self._selection, X)

    def _selection(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        delta = _softplus(X @ self._W_delta.T + self._b_delta)
        return delta, X @ self._W_B.T, X @ self._W_C.T

    _SCAN_FROM = 64  # "auto" loops over shorter sequences (measured faster on CPU)

    def _forward(self, X: torch.Tensor, method: str = "auto") -> torch.Tensor:
        delta, B, C = self._selection(X)
        if method == "auto":
            method = "recurrence" if X.shape[1] < self._SCAN_FROM else "scan"
        route = selective_loop if method == "recurrence" else selective_scan
        return route(delta, -torch.exp(self._A_log), B, C, X)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        delta, B, C = self._selection(X)
        n = X.shape[1]
        elapsed = _segment_sums(delta.transpose(1, 2)).permute(0, 2, 3, 1)  # Σ_{t=j+1}^{i} Δ_t[q], (b, i, j, d)
        decay = torch.exp(elapsed[..., None] * -torch.exp(self._A_log))     # (b, i, j, d, N), exponents <= 0
        causal = torch.tril(torch.ones(n, n, dtype=X.dtype))[None, :, :, None]
        coefficient = torch.einsum("bin,bijcn,bjn->bijc", C, decay, B) * delta[:, None] * causal
        return torch.diag_embed(coefficient)

    def _sizes(self) -> dict[str, int]:
        return {"N": self.N, "d": self.d}


class SSD(_Routed):
    """Mamba-2's state space duality layer: one scalar decay per head.

    The d channels are split into H heads of d_h = d / H channels; x_t^{(h)} ∈ ℝ^{d_h}
    is head h's slice.  With Δ_t^h = softplus(w_Δ^h · x_t + b_Δ^h), decay
    a_t^h = exp(Δ_t^h a_h) ∈ (0, 1) (a_h = −exp(A_log[h]) < 0), and B_t = W_B x_t,
    C_t = W_C x_t ∈ ℝ^N shared by the heads (Mamba-2 with one group),

        s_t^h = a_t^h s_{t−1}^h + Δ_t^h B_t x_t^{(h)ᵀ}   (N × d_h),   s_{−1} = 0,
        y_t = W_O concat_h((s_t^h)ᵀ C_t).

    Implements {prf:ref}`prop-ssd`:

        𝒲_ij(X) = Σ_h [ (C_i·B_j) Δ_j^h Π_{t=j+1}^{i} a_t^h ] W_O P_h,   j ≤ i,

    where P_h ∈ ℝ^{d×d} keeps head h's channels: a scalar times a shared map per
    head, so SSD lies in the factorized class with V_h = W_O P_h and its
    interaction rank is at most H (1 for one head).  The input is scaled by Δ_j as
    in Mamba-2's reference (x·dt); no D skip, no gate, no normalisation.

    Forward routes (`model(X, method=...)`): "recurrence" (the reference loop),
    "scan" (Mamba-2's chunked block decomposition: the quadratic form inside chunks
    of 32 steps, states carried across them), "quadratic" (the dual form: one n × n
    decay-masked attention per head, O(H n²)), "auto" (quadratic for n <= 64, scan
    otherwise: the faster routes on CPU, benchmarks/bench_forward.py).

    Args:
        A_log: shape (H,).
        W_delta: shape (H, d).   b_delta: shape (H,).
        W_B: shape (N, d).       W_C: shape (N, d).
        W_O: output map, shape (p, d).
        dtype: computation dtype (default float64).
    """

    def __init__(self, A_log: Any, W_delta: Any, b_delta: Any, W_B: Any, W_C: Any, W_O: Any, *,
                 dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        dims = self._set_parameters(A_log=(A_log, ("H",)), W_delta=(W_delta, ("H", "d")),
                                    b_delta=(b_delta, ("H",)), W_B=(W_B, ("N", "d")), W_C=(W_C, ("N", "d")),
                                    W_O=(W_O, ("p", "d")))
        if dims["d"] % dims["H"]:
            raise ValueError(f"A_log must have shape (H,) with H dividing d = {dims['d']}; got H = {dims['H']}")
        self.d, self.p, self.N, self.H = dims["d"], dims["p"], dims["N"], dims["H"]

    @classmethod
    def random(cls, d: int, p: int, N: int = 8, heads: int = 1, *, step_range: tuple[float, float] = (1e-3, 1e-1),
               seed: Any = 0, dtype: Any = torch.float64) -> "SSD":
        """a_h = −U(1, 16) as in Mamba-2, softplus(b_Δ) log-uniform in `step_range`,
        w_Δ, W_B, W_C, W_O with iid N(0, 1/d) entries."""
        d, p, N, heads = check_int(d, "d"), check_int(p, "p"), check_int(N, "N"), check_int(heads, "heads")
        rng = np.random.default_rng(seed)
        A_log = np.log(rng.uniform(1, 16, size=heads))
        b_delta = _random_step_biases(rng, step_range, heads)
        W_delta, W_B, W_C, W_O = (rng.standard_normal(shape) / np.sqrt(d)
                                  for shape in ((heads, d), (N, d), (N, d), (p, d)))
        return cls(A_log, W_delta, b_delta, W_B, W_C, W_O, dtype=dtype)

    A_log = exposed("A_log", "A_log, shape (H,); the decay rates are a_h = −exp(A_log[h]).")

    W_delta = exposed("W_delta", "w_Δ^h as rows, shape (H, d).")

    b_delta = exposed("b_delta", "b_Δ, shape (H,).")

    W_B = exposed("W_B", "W_B, shape (N, d): B_t = W_B x_t.")

    W_C = exposed("W_C", "W_C, shape (N, d): C_t = W_C x_t.")

    W_O = exposed("W_O", "Output map W_O, shape (p, d).")

    @property
    def a(self) -> np.ndarray:
        """Per-head decay rates a_h = −exp(A_log[h]), shape (H,)."""
        return (-torch.exp(self._A_log)).detach().cpu().numpy()

    def values(self) -> np.ndarray:
        """The shared maps V_h = W_O P_h (W_O restricted to head h's channels), shape (H, p, d)."""
        return self._values().detach().cpu().numpy()

    def _values(self) -> torch.Tensor:
        head_of_channel = torch.arange(self.d) // (self.d // self.H)
        P = (head_of_channel[None, :] == torch.arange(self.H)[:, None]).to(self.dtype)  # (H, d)
        return self._W_O[None] * P[:, None, :]

    def _steps(self, X: torch.Tensor) -> torch.Tensor:
        return _softplus(X @ self._W_delta.T + self._b_delta)  # Δ_t^h, (b, n, H)

    METHODS = ("auto", "recurrence", "scan", "quadratic")
    _QUADRATIC_UP_TO = 64  # "auto" takes the quadratic form up to this length (measured faster on CPU)

    def _forward(self, X: torch.Tensor, method: str = "auto") -> torch.Tensor:
        delta, B, C = self._steps(X), X @ self._W_B.T, X @ self._W_C.T
        if method == "auto":
            method = "quadratic" if X.shape[1] <= self._QUADRATIC_UP_TO else "scan"
        route = {"recurrence": ssd_loop, "scan": ssd_chunked, "quadratic": ssd_quadratic}[method]
        heads = route(delta, -torch.exp(self._A_log), B, C, X.unflatten(-1, (self.H, -1)))  # (b, n, H, d_h)
        return heads.flatten(-2) @ self._W_O.T

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        delta = self._steps(X).transpose(1, 2)                                   # (b, H, n)
        decay = torch.exp(_segment_sums(delta) * -torch.exp(self._A_log)[:, None, None])  # (b, H, i, j)
        causal = torch.tril(torch.ones(n, n, dtype=X.dtype))
        overlap = (X @ self._W_C.T) @ (X @ self._W_B.T).transpose(1, 2)         # C_i·B_j, (b, i, j)
        alpha = overlap[:, None] * decay * delta[:, :, None, :] * causal
        return factorized_operator(alpha, self._values())

    def _sizes(self) -> dict[str, int]:
        return {"H": self.H, "N": self.N, **super()._sizes()}


# -- trained layers: S4D's diagonal layer and S5's shared-state layer -------------------------


class _ModalSSM(_Routed):
    """An LTI layer with diagonal continuous dynamics, ZOH with a learned step and a skip D (p = d).

    A mode has the continuous eigenvalue λc = −exp(A_log) + i A_imag (A_imag = 0 for real modes),
    step Δ = exp(log_step), eigenvalue λ = e^{Δλc} and input weight B̄ = (e^{Δλc} − 1)/λc · B
    (`expm1`, so small Δλc keep their digits).
    Complex modes stand for conjugate pairs and are read out as 2 Re(·); real modes as they are.
    Subclasses compute `_lags(n)` (n, p, d) and the two routes; the operator is block Toeplitz.
    """

    METHODS = ("auto", "recurrence", "convolution")
    time_invariant = True  # an LTI map with lags `_lags(n)`: lib.heads accepts it

    def _modes(self, log_step: torch.Tensor, A_log: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Δλ and (e^{Δλ} − 1)/λ, complex when the layer has complex modes.
        lam = -torch.exp(A_log)
        if self.complex:
            lam = torch.complex(lam, self._A_imag)
        step_lam = torch.exp(log_step) * lam
        return step_lam, torch.expm1(step_lam) / lam

    def _readout(self, z: torch.Tensor) -> torch.Tensor:
        return 2 * z.real if self.complex else z

    def _forward(self, X: torch.Tensor, method: str = "auto") -> torch.Tensor:
        # "auto" is the convolution (n² work per mode, fast on CPU for the short sequences it trains on).
        return self._recurrence(X) if method == "recurrence" else self._convolution(X)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        b, n, _ = X.shape
        return _toeplitz(self._lags(n), n).expand(b, n, n, self.p, self.d)

    def lags(self, n: int) -> np.ndarray:
        """L_ℓ for ℓ = 0..n−1, shape (n, p, d): the layer is y_i = Σ_{ℓ≤i} L_ℓ x_{i−ℓ}."""
        return self._lags(check_int(n, "n")).detach().cpu().numpy()

    @property
    def steps(self) -> np.ndarray:
        """Δ = exp(log_step)."""
        return torch.exp(self._log_step).detach().cpu().numpy()

    @property
    def eigenvalues(self) -> np.ndarray:
        """The continuous eigenvalues λ (complex if the modes are), shape of A_log."""
        lam = -torch.exp(self._A_log).detach().cpu().numpy()
        return lam + 1j * self._A_imag.detach().cpu().numpy() if self.complex else lam

    D = exposed("D", "The skip D, shape (d,): L_0 gains diag(D).")

    def modes(self) -> tuple[np.ndarray, np.ndarray]:
        """Nodes ν_k (K,) and residues R_k (K, p, d), complex128, with L_ℓ = Σ_k ν_k^ℓ R_k (0⁰ = 1).

        One node λ per mode (and λ̄ for a complex one, residue R̄), and the node 0 with residue
        diag(D); K = 2·modes + 1 (complex) or modes + 1 (real).  Nodes need not be distinct.
        """
        nodes, residues = self._modes_and_residues()
        if self.complex:
            nodes, residues = torch.cat([nodes, nodes.conj()]), torch.cat([residues, residues.conj()])
        zero = torch.zeros(1, dtype=nodes.dtype)
        nodes = torch.cat([nodes, zero])
        residues = torch.cat([residues, torch.diag(self._D).to(residues.dtype)[None]])
        return nodes.detach().to(torch.complex128).numpy(), residues.detach().to(torch.complex128).numpy()


def _s4d_init(shape: tuple[int, ...], M: int, init: str) -> tuple[np.ndarray, np.ndarray]:
    # A_log, A_imag of S4D-Lin (λ = −½ + iπm, m = 0..M−1) or S4D-Real (λ = −(m+1), A_imag = 0).
    m = np.broadcast_to(np.arange(M, dtype=float), (*shape, M))
    if init == "lin":
        return np.full((*shape, M), np.log(0.5)), np.pi * m
    return np.log(m + 1.0), np.zeros((*shape, M))


class DiagonalSSM(_ModalSSM):
    """S4D's layer: d single-channel SSMs with diagonal A, each with its own learned step, and a skip D.

    Channel q (Gu et al. 2022) has M modes with continuous eigenvalues λc_qm, a step Δ_q, the
    eigenvalues λ_qm = e^{Δ_q λc_qm}, B̄_qm = (λ_qm − 1)/λc_qm (B_c = 1) and the kernel

        K[q, ℓ] = 2 Re Σ_m C_qm B̄_qm λ_qm^ℓ  (complex: C = C[..., 0] + i C[..., 1], state size N = 2M)
        K[q, ℓ] = Σ_m C_qm B̄_qm λ_qm^ℓ       (real: A_imag None, C (d, M), N = M),

    y_i[q] = Σ_{ℓ≤i} K[q, ℓ] x_{i−ℓ}[q] + D_q x_i[q]: an LTI map ({prf:ref}`def-lti-ssm` with a skip)
    whose lags are diagonal, L_ℓ = diag(K[:, ℓ]) + δ_{ℓ0} diag(D).  Routes: "recurrence" (the
    complex state, step by step: the reference) and "convolution" (with K; "auto").

    Args:
        log_step: shape (d,).  A_log: shape (d, M).  C: shape (d, M, 2) if complex, else (d, M).
        D: shape (d,).  A_imag: shape (d, M) for complex modes, None for real ones.
    """

    def __init__(self, log_step: Any, A_log: Any, C: Any, D: Any, A_imag: Any = None, *,
                 dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        self.complex = A_imag is not None
        modes = {"A_imag": (A_imag, ("d", "M"))} if self.complex else {}
        dims = self._set_parameters(log_step=(log_step, ("d",)), A_log=(A_log, ("d", "M")), D=(D, ("d",)),
                                    C=(C, ("d", "M", 2) if self.complex else ("d", "M")), **modes)
        self.d = self.p = dims["d"]
        self.M = dims["M"]
        self.N = 2 * self.M if self.complex else self.M

    @classmethod
    def random(cls, d: int, N: int, *, init: str = "lin", step_range: tuple[float, float] = (1e-3, 1e-1),
               seed: Any = 0, dtype: Any = torch.float64) -> "DiagonalSSM":
        """S4D's initialisation with state size N per channel: "lin", M = N/2 modes λ = −½ + iπm
        (m = 0..M−1, N even), C with E|C_qm|² = 1; "real", M = N modes λ = −(m+1), C ~ N(0, 1).
        log Δ uniform in log step_range; D ~ N(0, 1); default_rng(seed)."""
        d, N = check_int(d, "d"), check_int(N, "N")
        init = check_choice(init, "init", ("lin", "real"))
        if init == "lin" and N % 2:
            raise ValueError(f"N must be even for init='lin' (N/2 complex modes); got N = {N}")
        M = N // 2 if init == "lin" else N
        rng = np.random.default_rng(seed)
        log_step = np.log(_random_steps(rng, step_range, d))
        A_log, A_imag = _s4d_init((d,), M, init)
        C = rng.standard_normal((d, M, 2)) * np.sqrt(0.5) if init == "lin" else rng.standard_normal((d, M))
        return cls(log_step, A_log, C, rng.standard_normal(d), A_imag if init == "lin" else None, dtype=dtype)

    def kernel(self, n: int) -> np.ndarray:
        """K[q, ℓ] for ℓ = 0..n−1 (without D), shape (d, n)."""
        return self._kernel(check_int(n, "n")).detach().cpu().numpy()

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        # Δλ (d, M) and C B̄ (d, M).
        step_lam, factor = self._modes(self._log_step[:, None], self._A_log)
        C = torch.complex(self._C[..., 0], self._C[..., 1]) if self.complex else self._C
        return step_lam, C * factor

    def _modes_and_residues(self) -> tuple[torch.Tensor, torch.Tensor]:
        step_lam, CB = self._weights()                       # residue of mode (q, m): (CB)_qm E_qq
        E = torch.diag_embed(torch.eye(self.d, dtype=CB.dtype))      # E[q] = E_qq
        return torch.exp(step_lam).reshape(-1), (CB[..., None, None] * E[:, None]).reshape(-1, self.d, self.d)

    def _kernel(self, n: int) -> torch.Tensor:
        step_lam, CB = self._weights()
        ell = torch.arange(n, dtype=self.dtype, device=step_lam.device)
        return self._readout(torch.einsum("qm,qml->ql", CB, torch.exp(step_lam[..., None] * ell)))

    def _lags(self, n: int) -> torch.Tensor:
        lags = torch.diag_embed(self._kernel(n).T)
        return torch.cat([lags[:1] + torch.diag(self._D), lags[1:]])

    def _convolution(self, X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        return torch.einsum("ijq,bjq->biq", _toeplitz(self._kernel(n).T, n), X) + self._D * X

    def _recurrence(self, X: torch.Tensor) -> torch.Tensor:
        step_lam, CB = self._weights()
        mu, s, outputs = torch.exp(step_lam), None, []
        for x in X.unbind(1):                                     # s_i = λ s_{i−1} + x_i, per channel and mode
            s = x[..., None].to(mu.dtype) if s is None else mu * s + x[..., None]
            outputs.append(self._readout((CB * s).sum(-1)) + self._D * x)
        return torch.stack(outputs, 1)

    def _sizes(self) -> dict[str, int]:
        return {"N": self.N, **super()._sizes()}


class SharedStateSSM(_ModalSSM):
    """S5's layer: one multi-input multi-output SSM, M diagonal modes shared by the d channels, and a skip D.

    Mode m (Smith et al. 2023) has a continuous eigenvalue λc_m, its own step Δ_m, the eigenvalue
    λ_m = e^{Δ_m λc_m} and B̄_m = (λ_m − 1)/λc_m B_m; with complex B (M, d), C (d, M) (last axis:
    real, imaginary part) and conjugate pairs read out as 2 Re, the lags are full d × d matrices
    (state size N = 2M, called P in S5 and in `random` and `.P`),

        L_ℓ = 2 Re Σ_m C[:, m] λ_m^ℓ B̄_m + δ_{ℓ0} diag(D),   y_i = Σ_{ℓ≤i} L_ℓ x_{i−ℓ}.

    Deviations from S5: S4D-Lin eigenvalues rather than HiPPO-N's, a convolution instead of a
    parallel scan (same map).  Routes: "recurrence" (the reference), "convolution" ("auto").

    Args:
        log_step: shape (M,).  A_log, A_imag: shape (M,).  B: shape (M, d, 2).  C: shape (d, M, 2).
        D: shape (d,).
    """

    def __init__(self, log_step: Any, A_log: Any, A_imag: Any, B: Any, C: Any, D: Any, *,
                 dtype: Any = torch.float64) -> None:
        super().__init__(resolve_dtype(dtype))
        self.complex = True
        dims = self._set_parameters(log_step=(log_step, ("M",)), A_log=(A_log, ("M",)), A_imag=(A_imag, ("M",)),
                                    B=(B, ("M", "d", 2)), C=(C, ("d", "M", 2)), D=(D, ("d",)))
        self.d = self.p = dims["d"]
        self.M, self.P = dims["M"], 2 * dims["M"]

    @classmethod
    def random(cls, d: int, P: int, *, step_range: tuple[float, float] = (1e-3, 1e-1), seed: Any = 0,
               dtype: Any = torch.float64) -> "SharedStateSSM":
        """P = N states (even): S4D-Lin modes λc = −½ + iπm, m = 0..P/2−1; E|B|² = 1/d, E|C|² = 2/P per entry;
        log Δ_m uniform in log step_range; D ~ N(0, 1); default_rng(seed)."""
        d, P = check_int(d, "d"), check_int(P, "P")
        if P % 2:
            raise ValueError(f"P must be even (P/2 complex modes); got P = {P}")
        M, rng = P // 2, np.random.default_rng(seed)
        log_step = np.log(_random_steps(rng, step_range, M))
        A_log, A_imag = _s4d_init((), M, "lin")
        B = rng.standard_normal((M, d, 2)) * np.sqrt(0.5 / d)
        C = rng.standard_normal((d, M, 2)) * np.sqrt(0.5 / M)
        return cls(log_step, A_log, A_imag, B, C, rng.standard_normal(d), dtype=dtype)

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Δλ (M,), B̄ (M, d), C (d, M), complex.
        step_lam, factor = self._modes(self._log_step, self._A_log)
        B = torch.complex(self._B[..., 0], self._B[..., 1]) * factor[:, None]
        return step_lam, B, torch.complex(self._C[..., 0], self._C[..., 1])

    def _modes_and_residues(self) -> tuple[torch.Tensor, torch.Tensor]:
        step_lam, B, C = self._weights()                     # residue of mode m: C[:, m] B̄_m
        return torch.exp(step_lam), torch.einsum("pm,md->mpd", C, B)

    def _lags(self, n: int) -> torch.Tensor:
        step_lam, B, C = self._weights()
        ell = torch.arange(n, dtype=self.dtype, device=step_lam.device)
        lags = self._readout(torch.einsum("pm,ml,md->lpd", C, torch.exp(step_lam[:, None] * ell), B))
        return torch.cat([lags[:1] + torch.diag(self._D), lags[1:]])

    def _convolution(self, X: torch.Tensor) -> torch.Tensor:
        step_lam, B, C = self._weights()
        n = X.shape[1]
        powers = torch.exp(step_lam[None, :] * torch.arange(n, dtype=self.dtype, device=X.device)[:, None])
        states = torch.einsum("ijm,bjm->bim", _toeplitz(powers, n), X.to(B.dtype) @ B.T)
        return self._readout(states @ C.T) + self._D * X

    def _recurrence(self, X: torch.Tensor) -> torch.Tensor:
        step_lam, B, C = self._weights()
        mu, s, outputs = torch.exp(step_lam), None, []
        for x in X.unbind(1):                                     # s_i = λ ⊙ s_{i−1} + B̄ x_i
            u = x.to(B.dtype) @ B.T
            s = u if s is None else mu * s + u
            outputs.append(self._readout(s @ C.T) + self._D * x)
        return torch.stack(outputs, 1)

    def _sizes(self) -> dict[str, int]:
        return {"P": self.P, **super()._sizes()}


def _random_steps(rng: np.random.Generator, step_range: Any, size: int) -> np.ndarray:
    """Steps log-uniform in step_range = (lo, hi), 0 < lo <= hi."""
    if not isinstance(step_range, (tuple, list)) or len(step_range) != 2:
        raise TypeError(f"step_range must be a pair (lo, hi); got {step_range!r}")
    lo = check_real(step_range[0], "step_range[0]", positive=True)
    hi = check_real(step_range[1], "step_range[1]", positive=True)
    if hi < lo:
        raise ValueError(f"step_range must have lo <= hi; got {step_range!r}")
    return np.exp(rng.uniform(np.log(lo), np.log(hi), size=size))
