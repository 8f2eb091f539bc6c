"""The forward routes of the SSMs (loops and fast chunked scans), the lags by doubling, the FFT convolution.

An optional module: a first read of lib may skip it. The loops are the reference; every
other route agrees with its loop to rounding (tests/lib/test_scan.py).

LTI SSM (lib.ssm.LinearSSM): `lti_loop`, and `lti_chunked` (a convolution with the lags inside
chunks of 64 steps, the state carried across them).

Selective SSM (S6), per batch, channel q and state n (lib.ssm.SelectiveSSM):

    s_t[q, n] = exp(Δ_t[q] A[q, n]) s_{t−1}[q, n] + Δ_t[q] x_t[q] B_t[n],   s_{−1} = 0,
    y_t[q]    = Σ_n C_t[n] s_t[q, n].

`selective_scan`: a two-pass chunked scan with a hand-written backward (`_SelectiveScan`);
`selective_loop`: the step-by-step reference.

SSD (Mamba-2), one scalar decay per head h, state N × P per head (lib.ssm.SSD, before W_O):

    s_t^h = exp(Δ_t^h A[h]) s_{t−1}^h + B_t (Δ_t^h x_t^h)ᵀ,   y_t^h = (s_t^h)ᵀ C_t.

`ssd_chunked`: Mamba-2's block decomposition; `ssd_quadratic`: its dual (attention-like)
form; `ssd_loop`: the reference.  These use plain torch ops, so autograd differentiates
them.  Every route agrees with its loop to rounding.  B, C are shared by all heads, shape
(b, n, N), or per group, shape (b, n, G, N) with G dividing H: group g serves the H/G
consecutive heads gH/G, …, (g+1)H/G − 1 (Mamba-2's ngroups; lib.blocks.Mamba2Block).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .operators import toeplitz_operator


LOG2E = 1.0 / math.log(2.0)  # exp(z) = exp2(z·log2 e); torch's exp2 is ~4x faster than exp on CPU


# -- the loops: method="recurrence", the reference ---------------------------------------


def affine_loop(a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """All states of h_t = a_t h_{t−1} + u_t, h_{−1} = 0, along dim 1.

    Iterates over `unbind` slices: indexing a[:, t] instead gives each step's backward a
    full-size zero gradient, so the reverse pass costs O(n²) (12 s instead of 0.2 s at
    d = 64, n = 4096).  The forward values are identical.
    """
    h, states = torch.zeros_like(u[:, 0]), []
    for a_t, u_t in zip(a.unbind(1), u.unbind(1)):
        h = a_t * h + u_t
        states.append(h)
    return torch.stack(states, 1)


def selective_loop(delta, A, B, C, x):
    """y of the selective SSM by the sequential loop (mamba's `selective_scan_ref`).

    Args: delta, x (b, n, d); A (d, N); B, C (b, n, N).  Returns y (b, n, d).
    """
    decay = torch.exp(delta[..., None] * A)        # (b, n, d, N)
    drive = (delta * x)[..., None] * B[..., None, :]
    return torch.einsum("...cn,...n->...c", affine_loop(decay, drive), C)


def _per_head(B: torch.Tensor, H: int) -> torch.Tensor:
    """B or C of SSD as (b, n, H, N): shared (b, n, N), or per group (b, n, G, N), G | H."""
    if B.ndim == 3:
        return B[:, :, None, :].expand(B.shape[0], B.shape[1], H, B.shape[2])
    return B.repeat_interleave(H // B.shape[2], dim=2)


def ssd_loop(delta, A, B, C, x):
    """y of SSD by the sequential loop (before W_O).

    Args: delta (b, n, H); A (H,); B, C (b, n, N) or (b, n, G, N); x (b, n, H, P).
    Returns y (b, n, H, P).
    """
    H = x.shape[2]
    B, C = _per_head(B, H), _per_head(C, H)
    decay = torch.exp(delta * A)[..., None, None]                   # (b, n, H, 1, 1)
    drive = B[..., None] * (delta[..., None] * x)[..., None, :]     # (b, n, H, N, P)
    return torch.einsum("...hnp,...hn->...hp", affine_loop(decay, drive), C)


def lti_loop(A, B, C, X):
    """y of the LTI SSM s_t = A s_{t−1} + B x_t, y_t = C s_t by the loop. X (b, n, d) → (b, n, p)."""
    s, states = X.new_zeros(X.shape[0], A.shape[0]), []
    for u in (X @ B.T).unbind(1):
        s = s @ A.T + u
        states.append(s)
    return torch.stack(states, 1) @ C.T


# -- the LTI SSM in chunks ---------------------------------------------------------------------


def powers_times(A: torch.Tensor, M: torch.Tensor, n: int) -> torch.Tensor:
    """A^ℓ M for ℓ = 0..n−1, shape (n, N, k), by doubling: O(log n) large products."""
    N, k = M.shape
    out, power = M[:, None, :], A  # out holds A^ℓ M for ℓ < m; power = A^m
    while out.shape[1] < n:
        m = out.shape[1]
        out = torch.cat([out, (power @ out.reshape(N, m * k)).reshape(N, m, k)], 1)
        if out.shape[1] < n:
            power = power @ power
    return out[:, :n].permute(1, 0, 2)


def lti_chunked(A, B, C, X, chunk: int = 64):
    """y of the LTI SSM in chunks: a convolution with the lags inside each, the state carried across."""
    b, n, d = X.shape
    T = min(chunk, n)
    K = -(-n // T)
    chunks = F.pad(X, (0, 0, 0, K * T - n)).reshape(b, K, T, d)
    M = powers_times(A, B, T)  # A^ℓ B, (T, N, d)
    Y = torch.einsum("tspd,bksd->bktp", toeplitz_operator(C @ M, T), chunks)  # inside a chunk
    # Across chunks: the state s_k = A^T s_{k−1} + Σ_t A^{T−1−t} B x_t enters chunk k + 1 ...
    gathered = torch.einsum("tnd,bktd->bkn", M.flip(0), chunks)
    A_T = torch.linalg.matrix_power(A, T)
    s, entering = X.new_zeros(b, A.shape[0]), []
    for k in range(K):
        entering.append(s)
        s = s @ A_T.T + gathered[:, k]
    # ... and reaches its t-th output through C A^{t+1}.
    readout = powers_times(A.T, A.T @ C.T, T).transpose(1, 2)  # (T, p, N)
    Y = Y + torch.einsum("tpn,bkn->bktp", readout, torch.stack(entering, 1))
    return Y.reshape(b, K * T, C.shape[0])[:, :n]


# -- the chunked layout ---------------------------------------------------------------------


class _Chunks:
    """Time cut into K chunks of T steps, laid out (T, b, K, ...) or, `inner`, (T, b, ..., K).

    Step-within-chunk leads, so one step of a chunked scan touches one contiguous slab:
    all chunks advance together.  With `inner` the chunk index is the last (contiguous)
    axis, which keeps elementwise ops vectorised when the other axes are short (small d).
    Padding (zeros at the end) never reaches a kept output: the recurrence is causal,
    and a step with Δ = 0 keeps the state (decay 1, drive 0).
    """

    def __init__(self, n: int, T: int, inner: bool = False):
        self.n, self.T, self.inner = n, max(1, min(T, n)), inner
        self.K = -(-n // self.T)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(b, n, ...) -> (T, b, K, ...), or (T, b, ..., K) if inner."""
        pad = self.K * self.T - self.n
        if pad:
            x = torch.cat([x, x.new_zeros(x.shape[0], pad, *x.shape[2:])], 1)
        x = x.reshape(x.shape[0], self.K, self.T, *x.shape[2:]).movedim(2, 0)
        return (x.movedim(2, -1) if self.inner else x).contiguous()

    def join(self, y: torch.Tensor) -> torch.Tensor:
        """The inverse of `split`: -> (b, n, ...)."""
        y = (y.movedim(-1, 2) if self.inner else y).movedim(0, 2)
        return y.reshape(y.shape[0], self.K * self.T, *y.shape[3:])[:, :self.n]


# -- the selective scan ---------------------------------------------------------------------
#
# Two-pass chunked scan: (1) all K chunks run their T steps at once from a zero state,
# keeping each chunk's final state; (2) a log-depth scan over the chunks carries the true
# state into each, with the decay over a whole chunk, exp(A ΣΔ); (3) all chunks run again
# from their true entering states, now emitting y_t.  About 2T + log2 K sequential steps
# (T ≈ √n / 2, more at large d) instead of n.  The backward runs the same scheme in reverse for the adjoint
# g_t = ∂loss/∂h_t (g_t = C_t gy_t + a_{t+1} g_{t+1}).  Decays are exp2 of non-positive
# numbers, so nothing overflows in float32, however long the sequence, and every state
# is a sum of products of decays, never a difference: tiny outputs keep relative accuracy.
#
# A state is an N × d matrix per chunk: slab (b, K, N, d), or (b, N, d, K) with the chunk
# axis inner (small d: ops on short rows do not vectorise).  In the first layout the
# contractions over n or c are batched (1×N)(N×d) / (N×d)(d×1) matrix products, ~5x
# faster than the (d×N)(N×1) ones of the (d, N) layout lib uses.
#
# Each step recomputes its decays a_t = exp(Δ_t A) and drives u_t = B_t Δ_t x_t from the
# small per-step factors: no (n, d, N) tensor is formed in the forward, and the slabs stay
# in cache.  (Forming all decays at once, as the loop does, was measured: faster only for
# n·d·N below ~1e5, and at the mercy of page faults on the large temporaries.)


class _Factors:
    """The selective SSM's per-step factors in a chunked layout (see above)."""

    def __init__(self, delta, A, B, C, x, T, inner):
        self.chunks = c = _Chunks(x.shape[1], T, inner)
        self.T, self.inner = c.T, inner
        # Axes of a state slab: chunk, n, c (negative ones also index (T, ...) tensors).
        self.k_axis, self.n_axis, self.c_axis = (-1, -3, -2) if inner else (1, -2, -1)
        self.A = A.T[..., None] if inner else A.T                # (N, d, 1) | (N, d)
        self.A2 = (self.A * LOG2E).contiguous()                  # A·log2 e
        self.step = c.split(delta).unsqueeze(self.n_axis)        # Δ_t: (T, b, K, 1, d) | (T, b, 1, d, K)
        self.v = c.split(delta * x).unsqueeze(self.n_axis)       # Δ_t x_t, as Δ_t
        self.B = c.split(B).unsqueeze(self.c_axis)               # (T, b, K, N, 1) | (T, b, N, 1, K)
        self.C = c.split(C).unsqueeze(self.c_axis)
        self.D = torch.exp2(self.A2 * self.step.sum(0))          # decay over each chunk (a slab)

    def steps(self, *names):
        """Per-step views of the named factors (made once: indexing in a loop costs ~1 µs each)."""
        return [getattr(self, name).unbind(0) for name in names]

    def decays(self, step, out):
        """a_t = exp(Δ_t A) of one step of every chunk, into `out`."""
        return torch.mul(self.A2, step, out=out).exp2_()

    def read(self, vec_n, M, out=None):
        """Σ_n vec_n[n] M[n, c]: vec_n shaped like B, M a slab -> shaped like Δ_t."""
        if self.inner:
            return torch.sum(vec_n * M, self.n_axis, keepdim=True, out=out)
        return torch.matmul(vec_n.mT, M, out=out)

    def reduce(self, M, vec_c, out=None):
        """Σ_c M[n, c] vec_c[c]: M a slab, vec_c shaped like Δ_t -> shaped like B."""
        if self.inner:
            return torch.sum(M * vec_c, self.c_axis, keepdim=True, out=out)
        return torch.matmul(M, vec_c.mT, out=out)


def _carry(D: torch.Tensor, local_end: torch.Tensor, axis: int, reverse: bool = False) -> torch.Tensor:
    """E_k = D_{k−1} E_{k−1} + local_end_{k−1}, E_0 = 0: the state entering chunk k.

    D, local_end: slabs with the chunk index k on `axis`.  reverse=True runs from the last
    chunk back, E_k = D_{k+1} E_{k+1} + local_end_{k+1}: the adjoint reaching chunk k's end
    from later chunks.  A log-depth (Hillis–Steele) scan, ⌈log2 K⌉ rounds of whole-slab ops
    instead of K small ones; it composes the affine steps, so it only multiplies decays.
    """
    if reverse:
        return _carry(D.flip(axis), local_end.flip(axis), axis).flip(axis)
    K, shift, s = local_end.shape[axis], 1, local_end
    part = lambda z, start, length: z.narrow(axis, start, length)
    while shift < K:  # s_k ← s_k + D_k s_{k−shift}, D_k ← D_k D_{k−shift} (s_k: the state leaving chunk k)
        rest = K - shift
        s = torch.cat([part(s, 0, shift), torch.addcmul(part(s, shift, rest), part(D, shift, rest),
                                                        part(s, 0, rest))], axis)
        if 2 * shift < K:
            D = torch.cat([part(D, 0, shift), part(D, shift, rest) * part(D, 0, rest)], axis)
        shift *= 2
    return torch.cat([torch.zeros_like(part(s, 0, 1)), part(s, 0, K - 1)], axis)


def _forward(f: _Factors):
    steps, vs, Bs, Cs = f.steps("step", "v", "B", "C")
    h = torch.zeros_like(f.D)
    a = torch.empty_like(h)
    for t in range(f.T):                                         # (1) from zero
        h.mul_(f.decays(steps[t], a)).addcmul_(Bs[t], vs[t])
    E = _carry(f.D, h, f.k_axis)                                 # (2)
    h = E.clone()
    y = torch.empty_like(f.v)
    for t, y_t in enumerate(y.unbind(0)):                        # (3) true states
        h.mul_(f.decays(steps[t], a)).addcmul_(Bs[t], vs[t])
        f.read(Cs[t], h, out=y_t)
    return y, E


def _backward(f: _Factors, E, gy):
    """∂loss/∂(Δ through a_t), ∂/∂A, ∂/∂B, ∂/∂C, ∂/∂(Δx), in the chunked layout."""
    T = f.T
    steps, vs, Bs, Cs, gys = f.steps("step", "v", "B", "C") + [gy.unbind(0)]
    a = torch.empty_like(E)
    g = torch.zeros_like(E)                      # adjoint of each chunk's own outputs,
    for t in range(T - 1, -1, -1):               # carried out of its start
        g.addcmul_(Cs[t], gys[t]).mul_(f.decays(steps[t], a))
    g_end = _carry(f.D, g, f.k_axis, reverse=True)  # adjoint reaching each chunk's end
    # Recompute the states, keeping m_t = a_t h_{t−1} (for z_t below) and ∂/∂C_t = h_t gy_tᵀ.
    # One slab per step, not one (n, d, N) tensor: blocks over 32 MB are mmapped by glibc
    # and page-faulted afresh on every call (1.6 ns per float here).
    m, gC = [], torch.empty_like(f.C)
    h, h_next = E, (torch.empty_like(E), torch.empty_like(E))  # two buffers, used in turn
    for t, gC_t in enumerate(gC.unbind(0)):
        m.append(h * f.decays(steps[t], a))
        h = torch.addcmul(m[t], Bs[t], vs[t], out=h_next[t % 2])
        f.reduce(h, gys[t], out=gC_t)
    # True adjoints, reverse.  z_t = g_t a_t h_{t−1} = ∂loss/∂(Δ_t A): Δ_t gets Σ_n z_t A,
    # A gets Σ_t z_t Δ_t.
    gv, g_step, gB = torch.empty_like(f.v), torch.empty_like(f.v), torch.empty_like(f.B)
    gvs, g_steps, gBs = gv.unbind(0), g_step.unbind(0), gB.unbind(0)
    zA = torch.zeros_like(E)
    g = g_end
    for t in range(T - 1, -1, -1):
        g.addcmul_(Cs[t], gys[t])
        f.read(Bs[t], g, out=gvs[t])
        f.reduce(g, vs[t], out=gBs[t])
        z = m.pop().mul_(g)
        zA.addcmul_(z, steps[t])
        torch.sum(z.mul_(f.A), f.n_axis, keepdim=True, out=g_steps[t])
        if t:
            g.mul_(f.decays(steps[t], a))
    return g_step, zA, gB, gC, gv


class _SelectiveScan(torch.autograd.Function):
    """y of the selective SSM by the two-pass chunked scan, with a hand-written backward."""

    @staticmethod
    def forward(ctx, delta, A, B, C, x, T, inner):
        f = _Factors(delta, A, B, C, x, T, inner)
        y, E = _forward(f)
        ctx.save_for_backward(delta, A, B, C, x, E)  # E: the entering states, 1/T of a (n, d, N) tensor
        ctx.layout = f.T, inner
        return f.chunks.join(y.squeeze(f.n_axis))

    @staticmethod
    def backward(ctx, gy):
        delta, A, B, C, x, E = ctx.saved_tensors
        if torch.is_grad_enabled() or _is_vmapped(gy):
            # create_graph=True (higher derivatives) or vmap (jacobian(vectorize=True)): the
            # in-place backward can do neither, so differentiate the loop instead (slower, exact).
            return _vjp_by_autograd(selective_loop, (delta, A, B, C, x), gy) + (None, None)
        f = _Factors(delta, A, B, C, x, *ctx.layout)
        gy = f.chunks.split(gy.contiguous()).unsqueeze(f.n_axis)
        g_step, zA, gB, gC, gv = _backward(f, E, gy)
        x = f.chunks.split(x).unsqueeze(f.n_axis)
        like_x = lambda z: f.chunks.join(z.squeeze(f.n_axis))
        like_B = lambda z: f.chunks.join(z.squeeze(f.c_axis))
        gA = zA.sum((0, f.k_axis)).T                                 # (d, N)
        return like_x(g_step + gv * x), gA, like_B(gB), like_B(gC), like_x(gv * f.step), None, None


def _is_vmapped(t: torch.Tensor) -> bool:
    """True under (legacy or functorch) vmap, e.g. inside jacobian(..., vectorize=True).

    Uses torch internals (no public test exists); if they go, this says False and the
    vectorised-Jacobian test fails loudly rather than silently.
    """
    functorch = getattr(torch._C, "_functorch", None)
    tests = (getattr(functorch, name, None) for name in ("is_batchedtensor", "is_legacy_batchedtensor"))
    return any(test is not None and test(t) for test in tests)


def _vjp_by_autograd(route, inputs, grad):
    """Vector-Jacobian product through `route` by autograd; differentiable itself when grad
    mode is on (inputs that carry a graph stay connected to it)."""
    create_graph = torch.is_grad_enabled()
    with torch.enable_grad():
        # Without create_graph the inputs are cut from the outer graph, which the first backward
        # has already freed (jacobian(vectorize=True) runs this once per batched cotangent).
        inputs = [z if z.requires_grad and create_graph else z.detach().requires_grad_() for z in inputs]
        return torch.autograd.grad(route(*inputs), inputs, grad, allow_unused=True, create_graph=create_graph)


INNER_BELOW = 32  # d: below it the chunk axis goes innermost (benchmarks/bench_forward.py)


SLAB_BYTES = 1 << 18  # a state slab (all chunks, one step) of ~256 kB keeps two of them in L2


def chunk_length(b: int, n: int, d: int, N: int, itemsize: int) -> int:
    """Steps per chunk T: ≈ √n / 2 (√n / 4 with the chunk axis inner: ~10 ops a step against a
    log-depth carry), raised so that a slab of K = n / T chunks stays near SLAB_BYTES.
    The optimum is flat within a factor 2 of this (benchmarks/bench_forward.py)."""
    balanced = math.isqrt(n) // (4 if d < INNER_BELOW else 2)
    in_cache = -(-n * b * N * d * itemsize // SLAB_BYTES)
    return max(4, min(256, max(balanced, in_cache)))


def selective_scan(delta, A, B, C, x, chunk: int | None = None, inner: bool | None = None):
    """y of the selective SSM, fast: a two-pass chunked scan with a hand-written backward.

    Args:
        delta: Δ, shape (b, n, d), >= 0.     A: shape (d, N), < 0.
        B, C: shape (b, n, N).               x: shape (b, n, d).
        chunk: steps per chunk (default `chunk_length(...)`).
        inner: chunk axis innermost (default: d < INNER_BELOW).
    Returns:
        y, shape (b, n, d); agrees with `selective_loop` to rounding (~1e-15 relative in float64).
    """
    b, n, d = x.shape
    inner = d < INNER_BELOW if inner is None else inner
    chunk = chunk or chunk_length(b, n, d, A.shape[1], x.element_size())
    return _SelectiveScan.apply(delta, A, B, C, x, chunk, inner)


# -- SSD ------------------------------------------------------------------------------------


def _segment_sums(z: torch.Tensor) -> torch.Tensor:
    """S[..., i, j] = Σ_{t=j+1}^{i} z[..., t] for j <= i, −inf for j > i (time last).

    Summed segment by segment (a masked cumulative sum, not differences of one running
    sum, which lose ~|Σz|·eps: 2e-4 relative in float32 after 64 steps of Δ·A = −50).
    Built transposed, S[j, i], so the cumulative sum runs along the contiguous axis.
    """
    n = z.shape[-1]
    after = torch.triu(torch.ones(n, n, dtype=torch.bool, device=z.device), 1)  # [j, i]: i > j
    S = torch.where(after, z[..., None, :], 0).cumsum(-1)
    return S.masked_fill_(~torch.triu(torch.ones_like(after)), -math.inf).mT


def _decay_matrix(log2_a: torch.Tensor) -> torch.Tensor:
    """L[..., i, j] = Π_{t=j+1}^{i} a_t for j <= i, 0 above the diagonal (log2_a: log2 of a, time last)."""
    return _segment_sums(log2_a).exp2_()


def ssd_chunked(delta, A, B, C, x, chunk: int = 32):
    """y of SSD by Mamba-2's block decomposition (chunks of `chunk` steps).

    Inside a chunk: the quadratic (attention-like) form, Σ_j (C_i·B_j) Π_{t=j+1}^{i} a_t Δ_j x_j;
    across chunks: each chunk's final state from zero, carried by the chunks' total decays
    (one step per chunk), read out by C_i Π_{t<=i in chunk} a_t.
    Every exponent is a sum of Δ·A <= 0, so nothing overflows.  Plain torch ops: autograd.

    Args: delta (b, n, H); A (H,); B, C (b, n, N) or (b, n, G, N); x (b, n, H, P).
    Returns y (b, n, H, P).
    """
    b, n, H, P = x.shape
    if B.ndim == 3:  # one group
        B, C = B[:, :, None], C[:, :, None]
    G, N = B.shape[2], B.shape[3]
    R = H // G  # heads per group: head h = g R + r reads group g
    Q = min(chunk, n)
    K = -(-n // Q)
    if K * Q > n:  # Δ = 0, x = 0 on the padding: decay 1, no input
        pad = K * Q - n
        delta, B, C, x = (torch.cat([z, z.new_zeros(b, pad, *z.shape[2:])], 1) for z in (delta, B, C, x))
    log2_a = (delta * (A * LOG2E)).reshape(b, K, Q, H).transpose(2, 3)        # (b, K, H, Q)
    X = (delta[..., None] * x).reshape(b, K, Q, H, P).transpose(2, 3).contiguous()  # Δ_j x_j, (b, K, H, Q, P)
    Bg, Cg = (z.reshape(b, K, Q, G, N).transpose(2, 3) for z in (B, C))      # (b, K, G, Q, N)
    decay = _decay_matrix(log2_a)                                             # (b, K, H, Q, Q)
    # Inside each chunk: a group's C_i·B_j, shared by its R heads, times each head's decay.
    scores = (Cg @ Bg.mT)[:, :, :, None] * decay.view(b, K, G, R, Q, Q)
    y = scores.view(b, K, H, Q, Q) @ X                                        # (b, K, H, Q, P)
    # Each chunk's final state from zero, Σ_j Π_{t>j} a_t B_j X_jᵀ, with a group's R heads side
    # by side in the columns (b, K, G, N, R·P): one product per group, no copy of B per head.
    weighted = (X * decay[..., -1, :, None]).view(b, K, G, R, Q, P).transpose(3, 4).reshape(b, K, G, Q, R * P)
    local = Bg.mT @ weighted                                                  # (b, K, G, N, R·P)
    # States entering each chunk, E_k = D_{k−1} E_{k−1} + local_{k−1}: a loop over the K = n/Q
    # chunks (the log-depth `_carry` re-copies the states log2 K times: slower here).
    D = log2_a.sum(-1).exp2().view(b, K, G, R, 1).expand(b, K, G, R, P).reshape(b, K, G, 1, R * P)
    states = [torch.zeros_like(local[:, 0])]
    for k in range(1, K):
        states.append(torch.addcmul(local[:, k - 1], D[:, k - 1], states[-1]))
    entering = torch.stack(states, 1)                                         # (b, K, G, N, R·P)
    # Their contribution: C_i E_k, times Π_{t<=i in chunk} a_t per head.
    into = torch.cumsum(log2_a, -1).exp2_().view(b, K, G, R, Q).transpose(3, 4)[..., None]  # (b, K, G, Q, R, 1)
    y_off = (Cg @ entering).view(b, K, G, Q, R, P) * into
    y = y.view(b, K, G, R, Q, P).transpose(3, 4) + y_off                     # (b, K, G, Q, R, P)
    return y.transpose(2, 3).reshape(b, K * Q, H, P)[:, :n]


def ssd_quadratic(delta, A, B, C, x):
    """y of SSD by its dual quadratic form: one n × n decay-masked attention per head.

    Args: as `ssd_chunked`.  Time and memory O(H n²).
    """
    decay = _decay_matrix((delta * (A * LOG2E)).transpose(1, 2))              # (b, H, n, n)
    if B.ndim == 4:                                                           # per group
        H = x.shape[2]
        B, C = (_per_head(z, H).transpose(1, 2) for z in (B, C))             # (b, H, n, N)
        scores = (C @ B.mT) * decay
    else:
        scores = (C @ B.mT)[:, None] * decay
    return (scores @ (delta[..., None] * x).transpose(1, 2)).transpose(1, 2)


# -- causal convolution by the FFT ----------------------------------------------------------


def fft_causal_conv(x: torch.Tensor, kernel: torch.Tensor, equation: str) -> torch.Tensor:
    """y[:, t] = Σ_{ℓ<=t} kernel[ℓ] ⋆ x[:, t−ℓ] for t < n, in O(n log n).

    x: time on dim 1, (b, n, ...); kernel: time on dim 0, (m, ...) (taps ℓ >= n dropped);
    equation: einsum of one frequency of kernel and x, the frequency first in the kernel and
    second in x, e.g. "fpd,bfd->bfp" for (p, d) taps acting on (b, n, d).
    """
    n = x.shape[1]
    kernel = kernel[:n]
    size = 1 << (n + kernel.shape[0] - 2).bit_length()  # >= n + m − 1: circular = linear on t < n
    x_hat = torch.fft.rfft(x, n=size, dim=1)
    kernel_hat = torch.fft.rfft(kernel, n=size, dim=0)
    return torch.fft.irfft(torch.einsum(equation, kernel_hat, x_hat), n=size, dim=1)[:, :n]
