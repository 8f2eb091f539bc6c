"""The rank-gap chapter's probes: pointwise multiples, single-token witnesses, one head with
token-dependent coefficients.

{prf:ref}`lem-pointwise-multiple` (`sine_to_line`, `pointwise_multiple`, `pointwise_witness`),
{prf:ref}`thm-rank-gap` (`two_sided_gap`), {prf:ref}`thm-rank-gap-map` (`single_head_witness`) and
{prf:ref}`prop-single-head-generic-inputs` (`token_dependent_single_head`, `span_distances`).
Arrays are float64 numpy; `ssm` is a lib model with `lags(n)` (a LinearSSM).
"""

from __future__ import annotations

import numpy as np
import torch


def _row_sines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`sine_to_line` of each row pair of a, b (m, p) -> (m,)."""
    norm_a, energy_b = np.linalg.norm(a, axis=1), np.einsum("mp,mp->m", b, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        residual = np.linalg.norm(a - (np.einsum("mp,mp->m", a, b) / energy_b)[:, None] * b, axis=1)
        sines = np.minimum(1.0, residual / norm_a)
    return np.where(norm_a == 0, 0.0, np.where(energy_b == 0, 1.0, sines))


def sine_to_line(a: np.ndarray, b: np.ndarray) -> float:
    """‖a − proj_b a‖ / ‖a‖ ∈ [0, 1] for a, b (p,): 0 when a is a multiple of b (or a = 0), 1 when
    b = 0 ≠ a (the line is {0})."""
    return float(_row_sines(np.asarray(a, float)[None], np.asarray(b, float)[None])[0])


def pointwise_multiple(L: np.ndarray, V: np.ndarray, inputs: np.ndarray) -> tuple[float, np.ndarray, float]:
    """Probe {prf:ref}`lem-pointwise-multiple` on tokens u (m, d); L, V (p, d).

    Returns (largest sine_to_line(L u, V u), the hypothesis; factors c(u) = ⟨Lu, Vu⟩/‖Vu‖² (m,),
    NaN where Vu = 0; their spread (max − min)/max |c| over the defined ones, the conclusion,
    NaN when none is defined or all are 0).
    """
    Lu, Vu = inputs @ L.T, inputs @ V.T
    energy = np.einsum("mp,mp->m", Vu, Vu)
    with np.errstate(invalid="ignore", divide="ignore"):
        factors = np.where(energy > 0, np.einsum("mp,mp->m", Lu, Vu) / energy, np.nan)
    defined = factors[~np.isnan(factors)]
    scale = np.abs(defined).max() if len(defined) else 0.0
    spread = float((defined.max() - defined.min()) / scale) if scale > 0 else float("nan")
    return float(_row_sines(Lu, Vu).max()), factors, spread


def pointwise_witness(L: np.ndarray, V: np.ndarray, rtol: float = 1e-10) -> np.ndarray | None:
    """A unit u (d,) with L u ∉ span{V u}, or None when L is a multiple of V; L, V (p, d).

    The contrapositive of {prf:ref}`lem-pointwise-multiple`, following its proof. L is a multiple
    when ‖L − cV‖_F <= rtol ‖L‖_F, c = ⟨L, V⟩_F/‖V‖²_F (or L = 0). Candidates, in the proof's
    order: the right singular vectors w_q of V (its numerical kernel included, where V u = 0 ≠ L u;
    σ <= rtol σ_max counts as 0) and the sums w_q + w_q' off the kernel; the one with the largest
    sine is returned. Random probes cannot replace this: for V = v aᵀ and L = v bᵀ only u ∈ ker V
    is a witness.
    """
    norm_L, energy_V = np.linalg.norm(L), float((V * V).sum())
    c = float((L * V).sum()) / energy_V if energy_V > 0 else 0.0
    if norm_L == 0 or np.linalg.norm(L - c * V) <= rtol * norm_L:
        return None
    left, sigma, rows = np.linalg.svd(V)                      # rows: right singular vectors (d, d)
    rank = int((sigma > rtol * sigma[0]).sum()) if sigma[0] > 0 else 0
    images = np.zeros((V.shape[1], V.shape[0]))               # V w_q = σ_q left_q, 0 on the kernel
    images[:rank] = (left[:, :rank] * sigma[:rank]).T
    pairs = [(r, q) for r in range(rank) for q in range(r + 1, rank)]
    candidates = np.concatenate([rows, [rows[r] + rows[q] for r, q in pairs]]) if pairs else rows
    V_images = np.concatenate([images, [images[r] + images[q] for r, q in pairs]]) if pairs else images
    scale = np.linalg.norm(candidates, axis=1, keepdims=True)
    candidates, V_images = candidates / scale, V_images / scale
    return candidates[int(np.argmax(_row_sines(candidates @ L.T, V_images)))]


def _outputs(ssm, X: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return ssm(torch.from_numpy(X)).numpy()


def single_head_witness(ssm, n: int, V: np.ndarray,
                        rtol: float = 1e-10) -> tuple[int, np.ndarray, float] | None:
    """(lag ℓ, unit token u (d,), miss): the single-token input (u, 0, …, 0) of
    {prf:ref}`thm-rank-gap-map` on which every single head with value map V (p, d) misses.

    For each lag L_ℓ (ℓ < n) not a multiple of V, `pointwise_witness` gives u; a single head
    answers a multiple of V u at position ℓ, the SSM y_ℓ = L_ℓ u (its forward pass). miss is the
    least ‖y_ℓ − ŷ‖/‖y_ℓ‖ over ŷ ∈ span{V u} (1 when ‖V u‖ <= rtol ‖V‖), at the lag where it is
    largest; None when every lag is a multiple of V ({prf:ref}`thm-rank-gap`).
    """
    best = None
    for ell, L in enumerate(ssm.lags(n).numpy(force=True)):
        u = pointwise_witness(L, V, rtol)
        if u is None:
            continue
        X = np.zeros((n, ssm.d))
        X[0] = u
        y, Vu = _outputs(ssm, X)[ell], V @ u
        miss = 1.0 if np.linalg.norm(Vu) <= rtol * np.linalg.norm(V) else \
            float(np.linalg.norm(y - (y @ Vu) / (Vu @ Vu) * Vu) / np.linalg.norm(y))
        if best is None or miss > best[2]:
            best = ell, u, miss
    return best


def token_dependent_single_head(ssm, X: np.ndarray, V: np.ndarray, *,
                                causal: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best y_i = Σ_j α_ij(X) V x_j with α chosen for each input
    ({prf:ref}`prop-single-head-generic-inputs`): (errors ‖y_i − ŷ_i‖² (b, n), the SSM's outputs
    y (b, n, p), coefficients α (b, n, n)).

    X (b, n, d), V (p, d). α_i· is the least-norm least-squares solution of V Σ_j α_ij x_j ≈ y_i
    over j <= i (all j if not causal; numpy pinv, rtol 1e-12): ŷ_i is the point of V·span{x_j}
    nearest to y_i.
    """
    Y = _outputs(ssm, X)
    b, n, _ = X.shape
    projected = np.einsum("pd,bjd->bpj", V, X)                  # column j is V x_j
    alpha = np.zeros((b, n, n))
    for i in range(n):
        cols = i + 1 if causal else n
        alpha[:, i, :cols] = (np.linalg.pinv(projected[:, :, :cols], rtol=1e-12) @ Y[:, i, :, None])[..., 0]
    errors = ((Y - np.einsum("bij,bpj->bip", alpha, projected)) ** 2).sum(axis=2)
    return errors, Y, alpha


def span_distances(Y: np.ndarray, X: np.ndarray, V: np.ndarray | None = None, rtol: float = 1e-10) -> np.ndarray:
    """dist(y_i, V 𝒰_i)², 𝒰_i = span{x_1..x_i}: the least squared error of a causal single head at i.

    {prf:ref}`prop-single-head-generic-inputs` (1): Σ_{j<=i} α_ij V x_j ranges over V 𝒰_i. By
    Gram–Schmidt (twice) on V x_1, V x_2, … in turn, no least squares; V x_i joins the basis only
    when its residual exceeds rtol ‖V x_i‖. Y (b, n, p), X (b, n, d), V (p, d) (None: the
    identity); returns (b, n).
    """
    VX = X if V is None else X @ V.T
    b, n, p = VX.shape
    Q = np.zeros((b, p, n))                                     # column j: unit direction or 0
    distances = np.empty((b, n))
    for i in range(n):
        v = VX[:, i]
        for _ in range(2):                                      # twice is enough (Kahan)
            v = v - np.einsum("bpj,bj->bp", Q[:, :, :i], np.einsum("bpj,bp->bj", Q[:, :, :i], v))
        norm, scale = np.linalg.norm(v, axis=1), np.linalg.norm(VX[:, i], axis=1)
        keep = (norm > rtol * scale) & (scale > 0)
        Q[:, :, i] = np.where(keep[:, None], v / np.where(keep, norm, 1.0)[:, None], 0.0)
        basis = Q[:, :, : i + 1]
        residual = Y[:, i] - np.einsum("bpj,bj->bp", basis, np.einsum("bpj,bp->bj", basis, Y[:, i]))
        distances[:, i] = (residual ** 2).sum(1)
    return distances


def two_sided_gap(found: np.ndarray, least: np.ndarray) -> tuple[float, float]:
    """(below, above): the largest (1 − found/least)₊ and (found/least − 1)₊ over the rows of found
    (m, r) (errors found by r optimisers) against the least errors least (m,), e.g. σ₂(G)² of
    {prf:ref}`thm-rank-gap`. below > 0 contradicts the bound (possible only through an error in the
    fit or the bound: one-sided); above > 0 means the bound was not reached, which also catches a
    bound that is too small."""
    ratio = np.asarray(found, float) / np.asarray(least, float)[:, None]
    return float(np.clip(1 - ratio, 0, None).max()), float(np.clip(ratio - 1, 0, None).max())


# -- what keeps a softmax head above σ₂(G)²: position-only scores, and the simplex -----------------


def position_only_softmax(ssm, n: int, restarts: int = 3, iterations: int = 300,
                          seed: int = 0) -> tuple[float, np.ndarray, np.ndarray]:
    """The best causal softmax head whose scores depend on position only (W_Q = W_K = 0, scores
    b[i − j]): weights w_ij = softmax_{j<=i} b[i − j], operator w_ij V. For tokens with
    E[x_j x_j'ᵀ] = δ_jj' I its expected squared error is Σ_i Σ_{j<=i} ‖L_{i−j} − w_ij V‖²_F; for fixed b
    the best V is Σ w_ij L_{i−j} / Σ w_ij², which leaves ‖G‖²_F − ‖Σ w_ij L_{i−j}‖²_F / Σ w_ij².
    L-BFGS over b (at most `iterations` steps) from `restarts` random starts N(0, I). Returns
    (error, b (n,), V (p, d)), the best found: an upper bound on the optimum."""
    L = torch.as_tensor(ssm.lags(n).numpy(force=True))
    lag = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    causal, index = lag >= 0, lag.clamp(min=0)
    total = float((L**2).sum(dim=(1, 2)) @ torch.arange(n, 0, -1, dtype=L.dtype))

    blocks = torch.where(causal[..., None, None], L[index], 0.0).reshape(n, n, -1)

    def parts(b):
        w = torch.softmax(b[index].masked_fill(~causal, -torch.inf), dim=-1)
        return torch.einsum("ij,ijk->k", w, blocks).reshape(L.shape[1:]), (w**2).sum()

    best = (np.inf, None)
    generator = torch.Generator().manual_seed(seed)
    for start in range(restarts):
        b = torch.randn(n, dtype=L.dtype, generator=generator).requires_grad_()
        opt = torch.optim.LBFGS([b], max_iter=iterations, line_search_fn="strong_wolfe",
                                tolerance_grad=1e-10, tolerance_change=1e-13)

        def loss(opt=opt, b=b):
            opt.zero_grad()
            mixed, s = parts(b)
            value = total - (mixed**2).sum() / s
            value.backward()
            return value

        opt.step(loss)
        with torch.no_grad():
            mixed, s = parts(b)
            error = float(total - (mixed**2).sum() / s)
        if error < best[0]:
            best = (error, (b.detach().numpy().copy(), (mixed / s).numpy()))
    error, (b, V) = best
    return error, b, V


def position_only_error(ssm, n: int, b: np.ndarray, V: np.ndarray) -> float:
    """Σ_i Σ_{j<=i} ‖L_{i−j} − w_ij V‖²_F for w_ij = softmax_{j<=i} b[i − j], by loops in numpy."""
    L = ssm.lags(n).numpy(force=True)
    error = 0.0
    for i in range(n):
        w = np.exp(b[i::-1] - b[: i + 1].max())
        w /= w.sum()
        error += sum(((L[i - j] - w[j] * V) ** 2).sum() for j in range(i + 1))
    return float(error)


def simplex_oracle(ssm, X: np.ndarray, V: np.ndarray, stiffness: float = 1e4) -> tuple[np.ndarray, float]:
    """A single head whose coefficients are confined to the simplex (α_ij >= 0, Σ_{j<=i} α_ij = 1)
    but chosen for each input and position: nnls on [V x_1 … V x_i; stiffness·1ᵀ] against
    (y_i; stiffness), then α rescaled to sum exactly to one (a feasible head, so its error bounds
    the simplex optimum from above). X (b, n, d); returns (squared error summed over positions,
    per input (b,); the largest |Σ α − 1| before rescaling)."""
    from scipy.optimize import nnls

    Y = _outputs(ssm, X)
    errors, worst = np.zeros(len(X)), 0.0
    for k, (x, y) in enumerate(zip(X, Y)):
        VX = x @ V.T
        for i in range(len(x)):
            M = np.vstack([VX[: i + 1].T, stiffness * np.ones((1, i + 1))])
            alpha, _ = nnls(M, np.append(y[i], stiffness))
            worst = max(worst, abs(alpha.sum() - 1))
            alpha = alpha / alpha.sum()
            errors[k] += ((y[i] - alpha @ VX[: i + 1]) ** 2).sum()
    return errors, worst


def biased_softmax_head(X: np.ndarray, W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O) -> tuple[np.ndarray, np.ndarray]:
    """One causal softmax head with biases on queries, keys, values and output, by loops in numpy:
    y_i = W_O Σ_{j<=i} α_ij (W_V x_j + b_V) + b_O, α_ij = softmax_{j<=i} (q_i·k_j)/√d_k with
    q_i = W_Q x_i + b_Q, k_j = W_K x_j + b_K. X (n, d); returns (Y (n, p), α (n, n))."""
    n = len(X)
    Q, K, values = X @ W_Q.T + b_Q, X @ W_K.T + b_K, X @ W_V.T + b_V
    alpha, Y = np.zeros((n, n)), np.zeros((n, W_O.shape[0]))
    for i in range(n):
        scores = K[: i + 1] @ Q[i] / np.sqrt(W_Q.shape[0])
        weights = np.exp(scores - scores.max())
        alpha[i, : i + 1] = weights / weights.sum()
        Y[i] = W_O @ (alpha[i, : i + 1] @ values[: i + 1]) + b_O
    return Y, alpha


# -- the damped-rotation explorer (_static/explore/damped-rotation.js) --------------------------


def explorer_grid(low: float, high: float, points: int, keep: float) -> np.ndarray:
    """`points` radii with 1 − ρ log-spaced from 1 − low to 1 − high, plus `keep` (the chapter's
    value), sorted; a slider steps through them."""
    grid = 1 - np.logspace(np.log10(1 - low), np.log10(1 - high), points)
    return np.unique(np.round(np.append(grid, keep), 12))


def damped_rotation_explorer(radius: float, angle: float, n: int, *, points: int = 40,
                             angles: int = 60, low: float = 0.5, high: float = 0.999) -> dict:
    """The best single head for the damped rotation A = ρR(θ), B = C = I on a (ρ, θ) grid.

    Radii: `explorer_grid(low, high, points - 1, radius)`; angles: jπ/angles, j = 0..angles, plus
    `angle`. Per grid point ({prf:ref}`thm-approx-head-count`, `lib.optimal_head_errors`): "error"
    σ₂(G)², the least expected squared error of one head with input-independent coefficients;
    "relative" σ₂(G)²/‖G‖²_F, its fraction of the output energy; "direction" φ ∈ [0, π), the best
    value map V₁ = (cos φ I + sin φ J)/√2 of `lib.truncated_heads` (its sign is free), i.e. the best
    line through the lags (ρ^ℓ cos ℓθ, ρ^ℓ sin ℓθ) in the coordinates of span{I, J}, each lag
    weighted by n − ℓ. Unrounded float64 lists, indexed [radius][angle].
    """
    from lib import LinearSSM, optimal_head_errors, truncated_heads

    radii = explorer_grid(low, high, points - 1, radius)
    thetas = np.unique(np.round(np.append(np.linspace(0, np.pi, angles + 1), angle), 12))
    error, relative, direction = (np.zeros((len(radii), len(thetas))) for _ in range(3))
    for a, rho in enumerate(radii):
        for b, theta in enumerate(thetas):
            ssm = LinearSSM.damped_rotation(float(rho), float(theta))
            least = optimal_head_errors(ssm, n, 1)
            V = truncated_heads(ssm, n, 1).values()[0].detach().numpy()
            # V = x I + y J + (a part orthogonal to span{I, J}, zero here): x, y by ⟨V, I⟩/2, ⟨V, J⟩/2
            x, y = (V[0, 0] + V[1, 1]) / 2, (V[1, 0] - V[0, 1]) / 2
            error[a, b], relative[a, b] = least[1], least[1] / least[0]
            direction[a, b] = np.arctan2(y, x) % np.pi
    return {"n": int(n), "radius": radii.tolist(), "angle": thetas.tolist(),
            "initial": [int(np.argmin(abs(radii - radius))), int(np.argmin(abs(thetas - angle)))],
            "error": error.tolist(), "relative": relative.tolist(), "direction": direction.tolist()}


def lag_spiral(ssm, n: int) -> tuple[list[dict], np.ndarray, float]:
    """The damped rotation's lags in span{I, J}: L_ℓ = a_ℓ I + b_ℓ J with (a_ℓ, b_ℓ) read off
    lib's lags (a = L[0, 0], b = L[1, 0]). The one-head error weights lag ℓ by
    ‖vec(aI + bJ)‖² (n − ℓ) = 2(n − ℓ)(a² + b²), so the best single head's line is the top
    eigenvector u of M = 2 Σ (n − ℓ) (a, b)(a, b)ᵀ, and its error is the weighted sum of the
    squared distances to that line. Returns one row per lag (ℓ, a, b, weight 2(n − ℓ), distance
    to the line), u, and the largest entry of L_ℓ − (a_ℓ I + b_ℓ J) (0 for a rotation–scaling)."""
    L = ssm.lags(n).numpy(force=True)
    a, b = L[:, 0, 0], L[:, 1, 0]
    J = np.array([[0.0, -1.0], [1.0, 0.0]])
    off_span = float(np.abs(L - a[:, None, None] * np.eye(2) - b[:, None, None] * J).max())
    weight = 2.0 * (n - np.arange(n))
    points = np.stack([a, b], 1)
    _, vectors = np.linalg.eigh((points * weight[:, None]).T @ points)
    u = vectors[:, -1]
    distance = np.abs(points @ np.array([-u[1], u[0]]))
    rows = [{"lag": ell, "a": float(a[ell]), "b": float(b[ell]), "weight": float(weight[ell]),
             "distance to line": float(distance[ell])} for ell in range(n)]
    return rows, u, off_span
