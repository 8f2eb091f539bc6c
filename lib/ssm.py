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
from .base import SequenceMap, _view
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

    @property
    def A(self) -> np.ndarray:
        return _view(self._A)

    @property
    def B(self) -> np.ndarray:
        return _view(self._B)

    @property
    def C(self) -> np.ndarray:
        return _view(self._C)

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

    For each channel c = 1..d (so p = d), with a diagonal negative A[c] ∈ ℝ^N and
    input-dependent step, input and output vectors

        Δ_t = softplus(W_Δ x_t + b_Δ) ∈ ℝ^d,   B_t = W_B x_t ∈ ℝ^N,   C_t = W_C x_t ∈ ℝ^N,
        h_t[c] = exp(Δ_t[c] A[c]) ⊙ h_{t−1}[c] + Δ_t[c] B_t x_t[c],   h_{−1} = 0,
        y_t[c] = ⟨C_t, h_t[c]⟩.

    Implements {prf:ref}`prop-selective-ssm`: 𝒲_ij(X) is diagonal in the channels,

        𝒲_ij[c, c] = C_iᵀ (Π_{t=j+1}^{i} exp(Δ_t[c] A[c])) ⊙ (Δ_j[c] B_j),   j ≤ i,

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
        """Mamba's initialisation: A[c] = −(1, 2, …, N) (S4D-real), b_Δ so that
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

    @property
    def A_log(self) -> np.ndarray:
        """A_log, shape (d, N)."""
        return _view(self._A_log)

    @property
    def W_delta(self) -> np.ndarray:
        """W_Δ, shape (d, d)."""
        return _view(self._W_delta)

    @property
    def b_delta(self) -> np.ndarray:
        """b_Δ, shape (d,)."""
        return _view(self._b_delta)

    @property
    def W_B(self) -> np.ndarray:
        """W_B, shape (N, d)."""
        return _view(self._W_B)

    @property
    def W_C(self) -> np.ndarray:
        """W_C, shape (N, d)."""
        return _view(self._W_C)

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
        elapsed = _segment_sums(delta.transpose(1, 2)).permute(0, 2, 3, 1)  # Σ_{t=j+1}^{i} Δ_t[c], (b, i, j, d)
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

        h_t^h = a_t^h h_{t−1}^h + Δ_t^h B_t x_t^{(h)ᵀ}   (N × d_h),   h_{−1} = 0,
        y_t = W_O concat_h((h_t^h)ᵀ C_t).

    Implements {prf:ref}`prop-ssd`:

        𝒲_ij(X) = Σ_h [ (C_i·B_j) Δ_j^h Π_{t=j+1}^{i} a_t^h ] W_O P_h,   j ≤ i,

    where P_h ∈ ℝ^{d×d} keeps head h's channels: a scalar times a shared map per
    head, so SSD lies in the factorized class with V_h = W_O P_h and its
    interaction rank is at most H (1 for one head).  The input is scaled by Δ_j as
    in Mamba-2's reference (x·dt); no D skip, no gate, no normalisation.  Δ uses
    torch's softplus (exact to e^{-20} ≈ 2e-9 absolute above 20; see SelectiveSSM).

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

    @property
    def A_log(self) -> np.ndarray:
        """A_log, shape (H,); the decay rates are a_h = −exp(A_log[h])."""
        return _view(self._A_log)

    @property
    def W_delta(self) -> np.ndarray:
        """w_Δ^h as rows, shape (H, d)."""
        return _view(self._W_delta)

    @property
    def b_delta(self) -> np.ndarray:
        """b_Δ, shape (H,)."""
        return _view(self._b_delta)

    @property
    def W_B(self) -> np.ndarray:
        """W_B, shape (N, d): B_t = W_B x_t."""
        return _view(self._W_B)

    @property
    def W_C(self) -> np.ndarray:
        """W_C, shape (N, d): C_t = W_C x_t."""
        return _view(self._W_C)

    @property
    def W_O(self) -> np.ndarray:
        """Output map W_O, shape (p, d)."""
        return _view(self._W_O)

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
