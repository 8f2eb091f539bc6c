"""Plain-numpy transcriptions of the framework chapter's formulas (chapters/framework/index.md).

Independent of `lib` by construction: numpy only, never lib's code. Each function transcribes
one formula literally — explicit loops and matrix products, closed-form B-splines — so that a
bug in lib cannot sit on both sides of a comparison. Tests and the framework notebook (through
experiments/framework.py) compare lib against it; functions take plain arrays, never models.

Conventions are the book's: X (n, d) with X[j] = x_{j+1}; an operator W (n, n, p, d) with
W[i, j] = 𝒲_{i+1, j+1}; outputs (n, p).
"""

from __future__ import annotations

import numpy as np

RANK_RTOL = 1e-10  # the chapter's rank rule: singular values above 1e-10 times the largest


# -- scalar functions --------------------------------------------------------------------------


def softplus(z):
    """log(1 + e^z), computed without overflow."""
    return np.logaddexp(0.0, z)


def sigmoid(z):
    """1 / (1 + e^{-z}) without overflow for large |z|."""
    z = np.asarray(z, dtype=float)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e))


def silu(u):
    """u · sigmoid(u)."""
    return u * sigmoid(u)


def elu_plus_one(u):
    """elu(u) + 1: u + 1 for u > 0, e^u otherwise (Katharopoulos et al. 2020)."""
    u = np.asarray(u, dtype=float)
    return np.where(u > 0, u + 1, np.exp(np.minimum(u, 0)))


def tanh_secant(z):
    """σ(z) = tanh(z)/z with σ(0) = 1 (prop-rnn)."""
    z = np.asarray(z, dtype=float)
    safe = np.where(z == 0, 1.0, z)
    return np.where(z == 0, 1.0, np.tanh(safe) / safe)


def cardinal_cubic(x):
    """The cubic B-spline with knots 0, 1, 2, 3, 4, piece by piece (closed form)."""
    x = np.asarray(x, dtype=float)
    return np.select(
        [(0 <= x) & (x < 1), (1 <= x) & (x < 2), (2 <= x) & (x < 3), (3 <= x) & (x < 4)],
        [x**3 / 6, (-3 * x**3 + 12 * x**2 - 12 * x + 4) / 6,
         (3 * x**3 - 24 * x**2 + 60 * x - 44) / 6, (4 - x) ** 3 / 6],
        0.0,
    )


def cardinal_cubic_slope(x):
    """Derivative of `cardinal_cubic`, piece by piece."""
    x = np.asarray(x, dtype=float)
    return np.select(
        [(0 <= x) & (x < 1), (1 <= x) & (x < 2), (2 <= x) & (x < 3), (3 <= x) & (x < 4)],
        [x**2 / 2, (-9 * x**2 + 24 * x - 12) / 6, (9 * x**2 - 48 * x + 60) / 6, -((4 - x) ** 2) / 2],
        0.0,
    )


# -- generic helpers ---------------------------------------------------------------------------


def apply(W, X):
    """y_i = Σ_j W_ij x_j by an explicit loop (def-interaction-operator). W (n, n, p, d), X (n, d)."""
    n, _, p, _ = W.shape
    Y = np.zeros((n, p))
    for i in range(n):
        for j in range(n):
            Y[i] += W[i, j] @ X[j]
    return Y


def central_difference_gradient(f, X, h=1e-5):
    """∂ f(X) / ∂X by central differences (f scalar-valued, numpy)."""
    grad = np.zeros_like(X)
    for index in np.ndindex(X.shape):
        step = np.zeros_like(X)
        step[index] = h
        grad[index] = (f(X + step) - f(X - step)) / (2 * h)
    return grad


def numerical_rank(blocks, rtol=RANK_RTOL):
    """Number of singular values of the stacked vec(blocks) above rtol · largest (0 if all vanish).

    blocks: shape (m, p, d) (or (m, k) already vectorised).
    """
    M = np.asarray(blocks, dtype=float).reshape(len(blocks), -1)
    if M.size == 0:
        return 0
    sigma = np.linalg.svd(M, compute_uv=False)
    return int((sigma > rtol * sigma[0]).sum()) if sigma[0] > 0 else 0


def itemwise_error(actual, reference, item_ndim, floor=1e-12):
    """The largest relative error over items (blocks, tokens), each relative to its own norm.

    Items are the trailing `item_ndim` axes (2 for operator blocks, 1 for output tokens).
    An item whose reference norm is below `floor` times the largest item's is compared
    absolutely at that level, so structural zeros must come out (almost) exactly zero.
    Returns max_k ‖actual_k − reference_k‖ / max(‖reference_k‖, floor · max_k ‖reference_k‖).
    """
    actual, reference = np.asarray(actual, dtype=float), np.asarray(reference, dtype=float)
    if actual.shape != reference.shape:
        raise ValueError(f"actual has shape {actual.shape}, reference {reference.shape}")
    size = int(np.prod(reference.shape[reference.ndim - item_ndim:]))
    diff = np.linalg.norm((actual - reference).reshape(-1, size), axis=1)
    norms = np.linalg.norm(reference.reshape(-1, size), axis=1)
    scale = norms.max() if norms.size else 0.0
    if scale == 0:
        return float(diff.max()) if diff.size else 0.0
    return float((diff / np.maximum(norms, floor * scale)).max())


# -- the architectures, one by one (forward pass as usually computed; operator as the page gives it)


def dense_forward(W, X):
    """prop-dense: y_i = W x_i."""
    return np.array([W @ x for x in X])


def dense_operator(W, X):
    """prop-dense: 𝒲_ij = δ_ij W."""
    n, (p, d) = len(X), W.shape
    out = np.zeros((n, n, p, d))
    for i in range(n):
        out[i, i] = W
    return out


def ffn_forward(W1, W2, X):
    """prop-ffn: y_i = W2 relu(W1 x_i)."""
    return np.array([W2 @ np.maximum(W1 @ x, 0.0) for x in X])


def ffn_pattern(W1, x):
    """1[W1 x > 0], the activation pattern of one token, shape (m,)."""
    return (W1 @ x > 0).astype(float)


def ffn_operator(W1, W2, X):
    """prop-ffn: 𝒲_ii = W2 Π(x_i) W1 with Π(x) = diag(1[W1 x > 0]); 0 off the diagonal."""
    n, p, d = len(X), W2.shape[0], W1.shape[1]
    out = np.zeros((n, n, p, d))
    for i in range(n):
        out[i, i] = W2 @ np.diag(ffn_pattern(W1, X[i])) @ W1
    return out


def conv_forward(K, X):
    """prop-conv: y_i = Σ_{ℓ=0}^{r−1} K_ℓ x_{i−ℓ}, tokens before position 1 taken as zero."""
    r, p, _ = K.shape
    Y = np.zeros((len(X), p))
    for i in range(len(X)):
        for ell in range(r):
            if i - ell >= 0:
                Y[i] += K[ell] @ X[i - ell]
    return Y


def conv_operator(K, n):
    """prop-conv: 𝒲_ij = K_{i−j} for 0 ≤ i − j < r, else 0."""
    r, p, d = K.shape
    out = np.zeros((n, n, p, d))
    for i in range(n):
        for j in range(n):
            if 0 <= i - j < r:
                out[i, j] = K[i - j]
    return out


def rnn_pre_activations(W, U, X):
    """z_i = W s_{i−1} + U x_i with s_i = tanh(z_i), s_0 = 0; shape (n, N)."""
    s, Z = np.zeros(W.shape[0]), []
    for x in X:
        z = W @ s + U @ x
        Z.append(z)
        s = np.tanh(z)
    return np.array(Z)


def rnn_forward(W, U, C, X):
    """prop-rnn: y_i = C tanh(z_i)."""
    return np.tanh(rnn_pre_activations(W, U, X)) @ C.T


def rnn_operator(W, U, C, X):
    """prop-rnn: 𝒲_ij = C Φ_i W Φ_{i−1} W ⋯ Φ_{j+1} W Φ_j U (j ≤ i), Φ_i = diag(tanh(z_i)/z_i)."""
    D = [np.diag(tanh_secant(z)) for z in rnn_pre_activations(W, U, X)]
    n, p, d = len(X), C.shape[0], U.shape[1]
    out = np.zeros((n, n, p, d))
    for i in range(n):
        for j in range(i + 1):
            M = C @ D[i]
            for t in range(i - 1, j - 1, -1):
                M = M @ W @ D[t]
            out[i, j] = M @ U
    return out


def lti_lags(A, B, C, n):
    """def-lti-ssm: L_ℓ = C A^ℓ B for ℓ = 0..n−1, by repeated multiplication; shape (n, p, d)."""
    power, lags = np.eye(A.shape[0]), []
    for _ in range(n):
        lags.append(C @ power @ B)
        power = A @ power
    return np.array(lags)


def lti_forward(A, B, C, X):
    """def-lti-ssm: s_i = A s_{i−1} + B x_i, y_i = C s_i, s_0 = 0."""
    s, Y = np.zeros(A.shape[0]), []
    for x in X:
        s = A @ s + B @ x
        Y.append(C @ s)
    return np.array(Y)


def lti_convolution(A, B, C, X):
    """y_i = Σ_{j≤i} L_{i−j} x_j with the lags above (a route independent of the recurrence)."""
    n = len(X)
    L = lti_lags(A, B, C, n)
    # Y[i] = Σ_ℓ L_ℓ x_{i−ℓ}: one matrix product per lag, over all i at once.
    Y = np.zeros((n, C.shape[0]))
    for ell in range(n):
        Y[ell:] += X[: n - ell] @ L[ell].T
    return Y


def lti_operator(A, B, C, n):
    """prop-lti-ssm: 𝒲_ij = C A^{i−j} B for j ≤ i, else 0."""
    return conv_operator(lti_lags(A, B, C, n), n)


def selective_parts(A_log, W_delta, b_delta, W_B, W_C, X):
    """prop-selective-ssm: A = −exp(A_log) (d, N); Δ_t = softplus(W_Δ x_t + b_Δ) (n, d);
    B_t = W_B x_t, C_t = W_C x_t (n, N)."""
    return -np.exp(A_log), softplus(X @ W_delta.T + b_delta), X @ W_B.T, X @ W_C.T


def selective_forward(A_log, W_delta, b_delta, W_B, W_C, X):
    """prop-selective-ssm: s_t[q] = e^{Δ_t[q] A[q]} ⊙ s_{t−1}[q] + Δ_t[q] B_t x_t[q], y_t[q] = ⟨C_t, s_t[q]⟩."""
    A, delta, Bt, Ct = selective_parts(A_log, W_delta, b_delta, W_B, W_C, X)
    d, N = A.shape
    h, Y = np.zeros((d, N)), np.zeros((len(X), d))
    for t in range(len(X)):
        for c in range(d):
            h[c] = np.exp(delta[t, c] * A[c]) * h[c] + delta[t, c] * Bt[t] * X[t, c]
            Y[t, c] = Ct[t] @ h[c]
    return Y


def selective_operator(A_log, W_delta, b_delta, W_B, W_C, X):
    """prop-selective-ssm: 𝒲_ij[q, q] = C_iᵀ (∏_{t=j+1}^{i} e^{Δ_t[q] A[q]}) ⊙ Δ_j[q] B_j, j ≤ i."""
    A, delta, Bt, Ct = selective_parts(A_log, W_delta, b_delta, W_B, W_C, X)
    n, d = len(X), A.shape[0]
    out = np.zeros((n, n, d, d))
    for i in range(n):
        for j in range(i + 1):
            for c in range(d):
                product = np.ones(A.shape[1])
                for t in range(j + 1, i + 1):
                    product = product * np.exp(delta[t, c] * A[c])
                out[i, j, c, c] = Ct[i] @ (product * delta[j, c] * Bt[j])
    return out


def ssd_parts(A_log, W_delta, b_delta, W_B, W_C, X):
    """prop-ssd: Δ^h_t = softplus(w_Δ^h · x_t + b^h), a^h_t = e^{Δ^h_t a_h} with a_h = −exp(A_log[h])
    (both (n, H)); B_t = W_B x_t, C_t = W_C x_t (n, N)."""
    delta = softplus(X @ W_delta.T + b_delta)
    return delta, np.exp(delta * -np.exp(A_log)), X @ W_B.T, X @ W_C.T


def head_projections(H, d):
    """P_h ∈ ℝ^{d×d}, the diagonal projection onto head h's channels (d/H consecutive ones)."""
    size = d // H
    P = np.zeros((H, d, d))
    for h in range(H):
        P[h, h * size:(h + 1) * size, h * size:(h + 1) * size] = np.eye(size)
    return P


def ssd_forward(A_log, W_delta, b_delta, W_B, W_C, W_O, X):
    """prop-ssd: s^h_t = a^h_t s^h_{t−1} + Δ^h_t B_t x_t^{(h)ᵀ} (N × d/H), y_t = W_O concat_h(s^{hᵀ}_t C_t)."""
    delta, a, Bt, Ct = ssd_parts(A_log, W_delta, b_delta, W_B, W_C, X)
    H, d, N = len(A_log), X.shape[1], W_B.shape[0]
    size = d // H
    states = [np.zeros((N, size)) for _ in range(H)]
    Y = []
    for t in range(len(X)):
        outs = []
        for h in range(H):
            x_h = X[t, h * size:(h + 1) * size]
            states[h] = a[t, h] * states[h] + delta[t, h] * np.outer(Bt[t], x_h)
            outs.append(states[h].T @ Ct[t])
        Y.append(W_O @ np.concatenate(outs))
    return np.array(Y)


def ssd_coefficients(A_log, W_delta, b_delta, W_B, W_C, X):
    """prop-ssd: α^h_ij = (C_i · B_j) Δ^h_j ∏_{t=j+1}^{i} a^h_t for j ≤ i, else 0; shape (H, n, n)."""
    delta, a, Bt, Ct = ssd_parts(A_log, W_delta, b_delta, W_B, W_C, X)
    H, n = len(A_log), len(X)
    alpha = np.zeros((H, n, n))
    for h in range(H):
        for i in range(n):
            for j in range(i + 1):
                alpha[h, i, j] = (Ct[i] @ Bt[j]) * delta[j, h] * np.prod(a[j + 1:i + 1, h])
    return alpha


def ssd_values(W_O, H):
    """V_h = W_O P_h, shape (H, p, d)."""
    return np.array([W_O @ P for P in head_projections(H, W_O.shape[1])])


def factorized_operator(alpha, V):
    """def-factorized: 𝒲_ij = Σ_h α^h_ij V_h. alpha (H, n, n), V (H, p, d)."""
    H, n, _ = alpha.shape
    out = np.zeros((n, n) + V.shape[1:])
    for i in range(n):
        for j in range(n):
            for h in range(H):
                out[i, j] += alpha[h, i, j] * V[h]
    return out


def softmax_weights(W_Q, W_K, X, causal, bias=None):
    """prop-softmax-attention: α^h_ij = softmax_j((W_Q^h x_i)·(W_K^h x_j)/√d_k [+ b_h[i−j]]),
    over j ≤ i when causal; shape (H, n, n)."""
    H, d_k, _ = W_Q.shape
    n = len(X)
    alpha = np.zeros((H, n, n))
    for h in range(H):
        for i in range(n):
            keys = range(i + 1) if causal else range(n)
            scores = np.array([(W_Q[h] @ X[i]) @ (W_K[h] @ X[j]) / np.sqrt(d_k)
                               + (bias[h, i - j] if bias is not None else 0.0) for j in keys])
            e = np.exp(scores - scores.max())
            alpha[h, i, list(keys)] = e / e.sum()
    return alpha


def attention_values(W_V, W_O):
    """V_h = W_O^h W_V^h, shape (H, p, d)."""
    return np.array([W_O[h] @ W_V[h] for h in range(len(W_V))])


def softmax_forward(W_Q, W_K, W_V, W_O, X, causal, bias=None):
    """prop-softmax-attention: y_i = Σ_h W_O^h Σ_j α^h_ij W_V^h x_j."""
    alpha = softmax_weights(W_Q, W_K, X, causal, bias)
    Y = np.zeros((len(X), W_O.shape[1]))
    for h in range(len(W_Q)):
        for i in range(len(X)):
            mixed = sum(alpha[h, i, j] * (W_V[h] @ X[j]) for j in range(len(X)))
            Y[i] += W_O[h] @ mixed
    return Y


def linear_weights(W_Q, W_K, X, causal):
    """prop-linear-attention: α^h_ij = φ(q_i)ᵀφ(k_j) / Σ_{j'} φ(q_i)ᵀφ(k_{j'}) (j, j' ≤ i when causal)."""
    H, n = len(W_Q), len(X)
    alpha = np.zeros((H, n, n))
    for h in range(H):
        for i in range(n):
            keys = list(range(i + 1) if causal else range(n))
            kernel = np.array([elu_plus_one(W_Q[h] @ X[i]) @ elu_plus_one(W_K[h] @ X[j]) for j in keys])
            alpha[h, i, keys] = kernel / kernel.sum()
    return alpha


def linear_forward(W_Q, W_K, W_V, W_O, X, causal):
    """prop-linear-attention by running sums: S_i = S_{i−1} + φ(k_i)(W_V x_i)ᵀ, ν_i = ν_{i−1} + φ(k_i),
    y_i = Σ_h W_O^h S_iᵀ φ(q_i) / (φ(q_i)ᵀ ν_i) (full sums over all tokens when not causal)."""
    H, n = len(W_Q), len(X)
    Y = np.zeros((n, W_O.shape[1]))
    for h in range(H):
        phi_q = [elu_plus_one(W_Q[h] @ x) for x in X]
        phi_k = [elu_plus_one(W_K[h] @ x) for x in X]
        v = [W_V[h] @ x for x in X]
        S, z = np.zeros((W_Q.shape[1], W_V.shape[1])), np.zeros(W_Q.shape[1])
        if not causal:
            S = sum(np.outer(phi_k[j], v[j]) for j in range(n))
            z = sum(phi_k)
        for i in range(n):
            if causal:
                S = S + np.outer(phi_k[i], v[i])
                z = z + phi_k[i]
            Y[i] += W_O[h] @ (S.T @ phi_q[i]) / (phi_q[i] @ z)
    return Y


def kan_bases(grid_range, grid_size, u):
    """B_m(u), m = 0..G+2: cardinal cubic B-splines on the knots t_k = lo + (k − 3) h,
    h = (hi − lo)/G, with B_m supported on [t_m, t_{m+4}]; shape (len(u), G + 3)."""
    lo, hi = grid_range
    h = (hi - lo) / grid_size
    u = np.asarray(u, dtype=float)
    return np.stack([cardinal_cubic((u - (lo + (m - 3) * h)) / h) for m in range(grid_size + 3)], -1)


def kan_base_slopes_at_zero(grid_range, grid_size):
    """B'_m(0), shape (G + 3,)."""
    lo, hi = grid_range
    h = (hi - lo) / grid_size
    return np.array([cardinal_cubic_slope((0.0 - (lo + (m - 3) * h)) / h) / h for m in range(grid_size + 3)])


def kan_edge(w, c, grid_range, u):
    """prop-kan: φ_qq'(u) = w_qq' silu(u) + Σ_m c_qq'm (B_m(u) − B_m(0)); shape (len(u), p, d)."""
    grid_size = c.shape[2] - 3
    bases = kan_bases(grid_range, grid_size, u) - kan_bases(grid_range, grid_size, np.zeros(1))
    return w * silu(np.asarray(u, dtype=float))[:, None, None] + np.einsum("qrm,km->kqr", c, bases)


def kan_slope_at_zero(w, c, grid_range):
    """φ'_qq'(0) = w_qq' silu'(0) + Σ_m c_qq'm B'_m(0), with silu'(0) = 1/2; shape (p, d)."""
    return w / 2 + c @ kan_base_slopes_at_zero(grid_range, c.shape[2] - 3)


def kan_forward(w, c, grid_range, X):
    """prop-kan: y_i[q] = Σ_q' φ_qq'(x_i[q'])."""
    Y = np.zeros((len(X), w.shape[0]))
    for i, x in enumerate(X):
        phi = kan_edge(w, c, grid_range, x)  # [s, q, q'] = φ_qq'(x[s])
        Y[i] = sum(phi[r, :, r] for r in range(len(x)))
    return Y


def kan_operator(w, c, grid_range, X):
    """prop-kan: 𝒲_ii[q, q'] = φ_qq'(x_i[q']) / x_i[q'] (φ'_qq'(0) where x_i[q'] = 0); 0 off the diagonal."""
    n, (p, d) = len(X), w.shape
    slope = kan_slope_at_zero(w, c, grid_range)
    out = np.zeros((n, n, p, d))
    for i, x in enumerate(X):
        phi = kan_edge(w, c, grid_range, x)
        for r in range(d):
            out[i, i, :, r] = slope[:, r] if x[r] == 0 else phi[r, :, r] / x[r]
    return out


# -- inputs on which every proposition must hold ------------------------------------------


def input_families(n, d, rng, scale=30.0, batch=3):
    """Inputs on which every proposition must hold, each of shape (b, n', d).

    random:      iid N(0, 1) entries;
    zero tokens: random, with tokens 1, 3, 6, … (and one whole sequence) set to exactly 0;
    constant:    every token equal (attention weights tie; one activation pattern);
    one token:   n = 1;
    two tokens:  n = 2 (below a convolution's kernel length r = 3);
    large:       iid N(0, scale²) entries (saturating softmax and tanh, decays that underflow).
    """
    random = rng.standard_normal((batch, n, d))
    zeros = rng.standard_normal((batch, n, d))
    zeros[:, ::3] = 0.0
    zeros[0] = 0.0
    constant = np.broadcast_to(rng.standard_normal((batch, 1, d)), (batch, n, d)).copy()
    return {
        "random": random,
        "zero tokens": zeros,
        "constant": constant,
        "one token": rng.standard_normal((batch, 1, d)),
        "two tokens": rng.standard_normal((batch, 2, d)),
        "large": scale * rng.standard_normal((batch, n, d)),
    }


# -- prop-structured-dynamics ------------------------------------------------------------------


def adversarial_factors(n, N, d, p, rng):
    """Arbitrary per-step A_i (n, N, N), B_i (n, N, d), C_i (n, p, N): Gaussian, with a reset
    (A_2 = 0), a rank-one A_3, a large A_4 (norm ~ 10), B_5 = 0 and C_6 = 0 (for n >= 6)."""
    As, Bs, Cs = rng.standard_normal((n, N, N)), rng.standard_normal((n, N, d)), rng.standard_normal((n, p, N))
    As[1:2] = 0.0
    As[2:3] = np.outer(rng.standard_normal(N), rng.standard_normal(N))
    As[3:4] *= 10
    Bs[4:5] = 0.0
    Cs[5:6] = 0.0
    return As, Bs, Cs


def structured_recurrence(As, Bs, Cs, X):
    """def-structured-dynamics: s_0 = 0, s_i = A_i s_{i−1} + B_i x_i, y_i = C_i s_i.

    As (n, N, N), Bs (n, N, d), Cs (n, p, N), X (n, d); returns (n, p).
    """
    s, Y = np.zeros(As.shape[1]), []
    for A, B, C, x in zip(As, Bs, Cs, X):
        s = A @ s + B @ x
        Y.append(C @ s)
    return np.array(Y)


def structured_operator(As, Bs, Cs):
    """prop-structured-dynamics: 𝒲_ij = C_i A_i A_{i−1} ⋯ A_{j+1} B_j for j ≤ i, 0 for j > i."""
    n, p, d = len(As), Cs.shape[1], Bs.shape[2]
    out = np.zeros((n, n, p, d))
    for i in range(n):
        for j in range(i + 1):
            M = np.eye(As.shape[1])
            for t in range(j + 1, i + 1):
                M = As[t] @ M
            out[i, j] = Cs[i] @ M @ Bs[j]
    return out


def impulse_operator(As, Bs, Cs):
    """The operator of fixed factors by impulses: run the recurrence with x = e_k at position j
    (the recurrence is linear in X once the factors are fixed); shape (n, n, p, d)."""
    n, p, d = len(As), Cs.shape[1], Bs.shape[2]
    out = np.zeros((n, n, p, d))
    for j in range(n):
        for k in range(d):
            X = np.zeros((n, d))
            X[j, k] = 1.0
            out[:, j, :, k] = structured_recurrence(As, Bs, Cs, X)
    return out


def channel_factors(decay, drive, Ct, W_out):
    """Per-channel dynamics with state (d·N): A_t = blockdiag_c diag(decay[t, c]),
    B_t e_c = drive[t, c] in block c, C_t = W_out · blockdiag_c C_tᵀ."""
    n, d, N = decay.shape
    As, Bs, Cs = np.zeros((n, d * N, d * N)), np.zeros((n, d * N, d)), np.zeros((n, W_out.shape[0], d * N))
    for t in range(n):
        readout = np.zeros((d, d * N))
        for c in range(d):
            block = slice(c * N, (c + 1) * N)
            As[t, block, block] = np.diag(decay[t, c])
            Bs[t, block, c] = drive[t, c]
            readout[c, block] = Ct[t]
        Cs[t] = W_out @ readout
    return As, Bs, Cs


# -- interaction ranks as the chapter states them -----------------------------------------------


def ffn_rank(W1, W2, tokens):
    """prop-ffn: dim span{W2 Π W1 : Π a pattern realised by the tokens} = rank(P M), with P the
    realised patterns (rows) and M the rows vec(w2_k w1_kᵀ), k = 1..m. tokens: (t, d)."""
    patterns = np.unique(np.array([ffn_pattern(W1, x) for x in tokens]), axis=0)
    rank_one = np.array([np.outer(W2[:, k], W1[k]).ravel() for k in range(W1.shape[0])])
    return numerical_rank(patterns @ rank_one)


def quadratic_form_nonzero(W_B, W_C):
    """ω(x) = (W_C x)ᵀ(W_B x) is not identically zero iff W_Cᵀ W_B is not antisymmetric."""
    M = W_C.T @ W_B
    return bool(np.abs(M + M.T).max() > 1e-12 * max(np.abs(M).max(), 1e-300))


# -- prop-discretisation --------------------------------------------------------------------------


def continuous_systems(N, d, p, rng, hurwitz=4, singular=2):
    """(kind, A_c, B_c, C) test systems: Hurwitz A_c (a Gaussian shifted so its rightmost
    eigenvalue has real part −0.05), singular ones (a product of N × (N−1) and (N−1) × N
    Gaussians: rank N − 1), the nilpotent shift (ones above the diagonal) and A_c = 0."""
    systems = []
    for _ in range(hurwitz):
        A = rng.standard_normal((N, N))
        systems.append(("Hurwitz", A - (np.linalg.eigvals(A).real.max() + 0.05) * np.eye(N)))
    for _ in range(singular):
        systems.append(("singular", rng.standard_normal((N, N - 1)) @ rng.standard_normal((N - 1, N))))
    systems += [("nilpotent", np.eye(N, k=1)), ("zero", np.zeros((N, N)))]
    return [(kind, A, rng.standard_normal((N, d)), rng.standard_normal((p, N))) for kind, A in systems]


def system_names(systems):
    """'Hurwitz 1', 'Hurwitz 2', …, 'singular 1', …: the kinds of `continuous_systems`, numbered."""
    kinds = [s[0] for s in systems]
    return [f"{kind} {kinds[:k + 1].count(kind)}" for k, kind in enumerate(kinds)]


def bilinear(A_c, B_c, step):
    """Ā = (I − Δ/2 A_c)^{-1}(I + Δ/2 A_c), B̄ = (I − Δ/2 A_c)^{-1} Δ B_c, with an explicit inverse."""
    I = np.eye(len(A_c))
    inverse = np.linalg.inv(I - step / 2 * A_c)
    return inverse @ (I + step / 2 * A_c), inverse @ (step * B_c)


def _substeps(A_c, step, max_step_norm):
    """Enough RK4 steps that each has h ‖A_c‖₂ <= max_step_norm (local error ~ (h‖A_c‖)⁵/120)."""
    return max(100, int(np.ceil(step * np.linalg.norm(A_c, 2) / max_step_norm)))


def rk4_flow(A_c, B_c, step, max_step_norm=1e-3):
    """(Ā, B̄) = (s(Δ) for s(0) = e_k, x = 0;  s(Δ) for s(0) = 0, x = e_k) by classical
    Runge–Kutta on ṡ = A_c s + B_c x over [0, Δ], in steps h with h‖A_c‖₂ <= max_step_norm:
    the zero-order-hold matrices by integrating the ODE, with no matrix exponential."""
    N, d = B_c.shape
    substeps = _substeps(A_c, step, max_step_norm)
    h = step / substeps
    # Columns: N homogeneous solutions from the unit states, d forced ones from s(0) = 0.
    S = np.concatenate([np.eye(N), np.zeros((N, d))], 1)
    U = np.concatenate([np.zeros((d, N)), np.eye(d)], 1)  # the held input of each column
    S = _rk4(lambda S: A_c @ S + B_c @ U, S, h, substeps)
    return S[:, :N], S[:, N:]


def _rk4(f, s, h, steps):
    """`steps` classical Runge–Kutta steps of size h for ṡ = f(s)."""
    for _ in range(steps):
        k1 = f(s)
        k2 = f(s + h / 2 * k1)
        k3 = f(s + h / 2 * k2)
        k4 = f(s + h * k3)
        s = s + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return s


def held_input_samples(A_c, B_c, C, step, X, max_step_norm=1e-3):
    """y(iΔ) = C s(iΔ) for ṡ = A_c s + B_c x(t), s(0) = 0, x(t) = x_i on ((i−1)Δ, iΔ], by RK4."""
    substeps = _substeps(A_c, step, max_step_norm)
    h, s, Y = step / substeps, np.zeros(len(A_c)), []
    for x in X:
        s = _rk4(lambda s: A_c @ s + B_c @ x, s, h, substeps)
        Y.append(C @ s)
    return np.array(Y)


def mapped_spectral_radius(A_c, step, method):
    """max |μ| over the eigenvalues λ of A_c mapped by the rule: μ = (1 + Δλ/2)/(1 − Δλ/2)
    (bilinear) or μ = e^{Δλ} (zoh)."""
    lam = np.linalg.eigvals(A_c)
    if method == "bilinear":
        return float(np.abs((1 + step * lam / 2) / (1 - step * lam / 2)).max())
    return float(np.abs(np.exp(step * lam)).max())


def column_error(actual, reference):
    """Largest relative error over the columns of a matrix (each relative to its own norm)."""
    return itemwise_error(np.asarray(actual).T, np.asarray(reference).T, 1)


# -- prop-mamba-block, prop-mamba2-block: the blocks as built --------------------------------------
#
# P: a dict of numpy arrays named as the modules' state dicts (in_proj.weight, conv1d.weight, …;
# a bias that is absent is missing from P). Tap k of the conv, w_k = conv1d.weight[:, 0, K−1−k],
# multiplies u_{m−k} in output m; tokens before position 1 are zero.


def _bias(P, name, size):
    return P.get(name, np.zeros(size))


def block_conv(P, U):
    """c_m = Σ_{k<=min(K−1, m)} w_k ⊙ u_{m−k} + conv bias, for all conv channels; U (n, channels)."""
    W = P["conv1d.weight"][:, 0, :]
    K, (n, width) = W.shape[1], U.shape
    c = np.tile(_bias(P, "conv1d.bias", width), (n, 1))
    for m in range(n):
        for k in range(min(K, m + 1)):
            c[m] += W[:, K - 1 - k] * U[m - k]
    return c


def _block_coefficients(P, kappa, c, scale, x_rows, X):
    """g_ij = s_i ⊙ Σ_k w_k ⊙ κ_{i,j+k} ⊙ σ(c_{j+k}) (j + k <= i) and
    β_i = U(s_i ⊙ Σ_m κ_im ⊙ σ(c_m) ⊙ e_m) + out bias, e_m = conv bias + Σ_{k<=min(K−1,m)} w_k ⊙ x-bias."""
    n, D = kappa.shape[0], kappa.shape[2]
    W = P["conv1d.weight"][:D, 0, :]
    K = W.shape[1]
    x_bias = _bias(P, "in_proj.bias", P["in_proj.weight"].shape[0])[x_rows]
    g = np.zeros((n, n, D))
    beta = np.zeros((n, P["out_proj.weight"].shape[0]))
    for i in range(n):
        inner = np.zeros(D)
        for m in range(i + 1):
            e = _bias(P, "conv1d.bias", W.shape[0])[:D] + sum(W[:, K - 1 - k] * x_bias for k in range(min(K, m + 1)))
            inner += kappa[i, m] * sigmoid(c[m]) * e
            for k in range(K):
                if m - k >= 0:
                    g[i, m - k] += scale[i] * W[:, K - 1 - k] * kappa[i, m] * sigmoid(c[m])
        beta[i] = P["out_proj.weight"] @ (scale[i] * inner) + _bias(P, "out_proj.bias", len(beta[i]))
    return g, beta


def mamba_block(P, X):
    """prop-mamba-block, one sequence X (n, d): (y by the recurrence (n, d), g (n, n, d_inner), β (n, d))."""
    D, (R_N2, _) = P["D"].shape[0], P["x_proj.weight"].shape
    N = P["A_log"].shape[1]
    R = R_N2 - 2 * N
    proj = X @ P["in_proj.weight"].T + _bias(P, "in_proj.bias", 2 * D)
    u, z = proj[:, :D], proj[:, D:]
    c = block_conv(P, u)
    v = silu(c)
    low = v @ P["x_proj.weight"].T
    delta = softplus(low[:, :R] @ P["dt_proj.weight"].T + P["dt_proj.bias"])
    Bt, Ct, A = low[:, R:R + N], low[:, R + N:], -np.exp(P["A_log"])
    n = len(X)
    state, o = np.zeros((D, N)), np.zeros((n, D))
    for t in range(n):
        state = np.exp(delta[t][:, None] * A) * state + (delta[t] * v[t])[:, None] * Bt[t]
        o[t] = state @ Ct[t] + P["D"] * v[t]
    y = (o * silu(z)) @ P["out_proj.weight"].T + _bias(P, "out_proj.bias", X.shape[1])
    kappa = np.zeros((n, n, D))
    for i in range(n):
        for m in range(i + 1):
            product = np.ones((D, N))
            for t in range(m + 1, i + 1):
                product = product * np.exp(delta[t][:, None] * A)
            kappa[i, m] = (product * delta[m][:, None] * Bt[m]) @ Ct[i] + (P["D"] if m == i else 0)
    g, beta = _block_coefficients(P, kappa, c, silu(z), slice(0, D), X)
    return y, g, beta


def mamba2_block(P, X, headdim, ngroups, eps):
    """prop-mamba2-block, one sequence X (n, d): (y by the recurrence, g (n, n, d_inner), β (n, d))."""
    H, D = P["A_log"].shape[0], P["out_proj.weight"].shape[1]
    GN = (P["conv1d.weight"].shape[0] - D) // 2
    N = GN // ngroups
    proj = X @ P["in_proj.weight"].T + _bias(P, "in_proj.bias", P["in_proj.weight"].shape[0])
    z, xBC, dt = proj[:, :D], proj[:, D:2 * D + 2 * GN], proj[:, 2 * D + 2 * GN:]
    pre = block_conv(P, xBC)
    act = silu(pre)
    v, Bt, Ct = act[:, :D], act[:, D:D + GN], act[:, D + GN:]
    delta, a = softplus(dt + P["dt_bias"]), -np.exp(P["A_log"])
    n = len(X)
    group = lambda h: h // (H // ngroups)                                   # the group serving head h
    ch = lambda h: slice(h * headdim, (h + 1) * headdim)
    BN = lambda t, h: Bt[t, group(h) * N:(group(h) + 1) * N]
    CN = lambda t, h: Ct[t, group(h) * N:(group(h) + 1) * N]
    o, states = np.zeros((n, D)), [np.zeros((N, headdim)) for _ in range(H)]
    for t in range(n):
        for h in range(H):
            states[h] = np.exp(delta[t, h] * a[h]) * states[h] + delta[t, h] * np.outer(BN(t, h), v[t, ch(h)])
            o[t, ch(h)] = states[h].T @ CN(t, h) + P["D"][h] * v[t, ch(h)]
    r = o * silu(z)
    size = D // ngroups
    inv_rms = np.zeros((n, D))
    for t in range(n):
        for gr in range(ngroups):
            part = slice(gr * size, (gr + 1) * size)
            inv_rms[t, part] = 1 / np.sqrt(np.mean(r[t, part] ** 2) + eps)
    y = (P["norm.weight"] * r * inv_rms) @ P["out_proj.weight"].T + _bias(P, "out_proj.bias", X.shape[1])
    kappa = np.zeros((n, n, D))
    for i in range(n):
        for m in range(i + 1):
            for h in range(H):
                decay = np.prod([np.exp(delta[t, h] * a[h]) for t in range(m + 1, i + 1)])
                kappa[i, m, ch(h)] = CN(i, h) @ BN(m, h) * delta[m, h] * decay + (P["D"][h] if m == i else 0)
    scale = P["norm.weight"] * inv_rms * silu(z)
    g, beta = _block_coefficients(P, kappa, pre[:, :D], scale, slice(D, 2 * D), X)
    return y, g, beta
