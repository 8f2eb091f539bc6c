"""The framework chapter's checks: lib's models against the page's formulas in numpy.

The formulas are the `reference` package's (numpy only, never lib); this module reads a lib
model's parameters (`.numpy(force=True)`) into them, and builds the tables and checks of
chapters/framework/operators.ipynb. A zoo is a list of (name, proposition label, model), as
`lib.architecture_zoo` returns it. Inputs X are numpy, (n, d) or (b, n, d).
"""

from __future__ import annotations

import numpy as np
import torch

import reference as ref
from lib import (SSD, CausalConv1d, Dense, ElmanRNN, FeedForward, KANLayer, LinearAttention, LinearSSM, Mamba2Block,
                 MambaBlock, SelectiveSSM, SoftmaxAttention, operator_span, relative_error)

TOLERANCE = 1e-10  # on every per-item error, for every input family (and the impulses)


def _parameters(model) -> dict[str, np.ndarray]:
    return {name: value.numpy(force=True) for name, value in model.named_parameters()}


def _lib(method, X: np.ndarray) -> np.ndarray:
    """A lib model's method (forward or operator) on numpy X, as numpy."""
    with torch.no_grad():
        return method(torch.from_numpy(X)).numpy()


# -- dispatch: a lib model's forward pass, operator and factors from the reference -------------


def forward(model, X: np.ndarray) -> np.ndarray:
    """The layer computed the usual way (recurrences, convolutions, running sums), in numpy."""
    if X.ndim == 3:
        return np.stack([forward(model, x) for x in X])
    P = _parameters(model)
    if isinstance(model, Dense):
        return ref.dense_forward(P["W"], X)
    if isinstance(model, FeedForward):
        return ref.ffn_forward(P["W1"], P["W2"], X)
    if isinstance(model, CausalConv1d):
        return ref.conv_forward(P["K"], X)
    if isinstance(model, ElmanRNN):
        return ref.rnn_forward(P["W"], P["U"], P["C"], X)
    if isinstance(model, LinearSSM):
        return ref.lti_forward(P["A"], P["B"], P["C"], X)
    if isinstance(model, SelectiveSSM):
        return ref.selective_forward(P["A_log"], P["W_delta"], P["dt_bias"], P["W_B"], P["W_C"], X)
    if isinstance(model, SSD):
        return ref.ssd_forward(P["A_log"], P["W_delta"], P["dt_bias"], P["W_B"], P["W_C"], P["W_O"], X)
    if isinstance(model, SoftmaxAttention):
        return ref.softmax_forward(P["W_Q"], P["W_K"], P["W_V"], P["W_O"], X, model.causal,
                                   P.get("position_bias"))
    if isinstance(model, LinearAttention):  # the reference's φ is elu + 1, lib's default
        return ref.linear_forward(P["W_Q"], P["W_K"], P["W_V"], P["W_O"], X, model.causal)
    if isinstance(model, KANLayer):
        return ref.kan_forward(P["silu_weights"], P["spline_coefficients"], model.grid_range, X)
    raise NotImplementedError(f"no reference for {type(model).__name__}")


def coefficients(model, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(α (H, n, n), V (H, p, d)) of a factorized model at X (n, d); Dense: α = I, V = W."""
    P = _parameters(model)
    if isinstance(model, Dense):
        return np.eye(len(X))[None], P["W"][None]
    if isinstance(model, SSD):
        alpha = ref.ssd_coefficients(P["A_log"], P["W_delta"], P["dt_bias"], P["W_B"], P["W_C"], X)
        return alpha, ref.ssd_values(P["W_O"], model.H)
    values = ref.attention_values(P["W_V"], P["W_O"])
    if isinstance(model, SoftmaxAttention):
        return ref.softmax_weights(P["W_Q"], P["W_K"], X, model.causal, P.get("position_bias")), values
    if isinstance(model, LinearAttention):
        return ref.linear_weights(P["W_Q"], P["W_K"], X, model.causal), values
    raise NotImplementedError(f"{type(model).__name__} is not in the factorized class")


def operator(model, X: np.ndarray) -> np.ndarray:
    """The operator the chapter's proposition gives, (n, n, p, d) or (b, n, n, p, d), in numpy."""
    if X.ndim == 3:
        return np.stack([operator(model, x) for x in X])
    P = _parameters(model)
    if isinstance(model, FeedForward):
        return ref.ffn_operator(P["W1"], P["W2"], X)
    if isinstance(model, CausalConv1d):
        return ref.conv_operator(P["K"], len(X))
    if isinstance(model, ElmanRNN):
        return ref.rnn_operator(P["W"], P["U"], P["C"], X)
    if isinstance(model, LinearSSM):
        return ref.lti_operator(P["A"], P["B"], P["C"], len(X))
    if isinstance(model, SelectiveSSM):
        return ref.selective_operator(P["A_log"], P["W_delta"], P["dt_bias"], P["W_B"], P["W_C"], X)
    if isinstance(model, KANLayer):
        return ref.kan_operator(P["silu_weights"], P["spline_coefficients"], model.grid_range, X)
    if isinstance(model, Dense):
        return ref.dense_operator(P["W"], X)
    return ref.factorized_operator(*coefficients(model, X))


def agreement(model, X: np.ndarray) -> dict[str, float]:
    """Per-item errors on a batch X (b, n, d), each the largest over its sequences: "operator"
    (lib's against the formula, blockwise), "forward" (lib's against the usual computation,
    tokenwise) and "identity" (Σ_j 𝒲_ij x_j against the usual computation, both numpy)."""
    W_lib, Y_lib = _lib(model.operator, X), _lib(model, X)
    W_ref, Y_ref = operator(model, X), forward(model, X)
    return {
        "operator": max(ref.itemwise_error(a, r, 2) for a, r in zip(W_lib, W_ref)),
        "forward": max(ref.itemwise_error(a, r, 1) for a, r in zip(Y_lib, Y_ref)),
        "identity": max(ref.itemwise_error(ref.apply(w, x), y, 1) for w, x, y in zip(W_ref, X, Y_ref)),
    }


def operator_norms(model, X: np.ndarray) -> np.ndarray:
    """‖𝒲_ij(X)‖_F of lib's operator on one sequence X (n, d): shape (n, n), for heat maps."""
    with torch.no_grad():
        return torch.linalg.matrix_norm(model.operator(torch.from_numpy(X))).numpy()


# -- prop-structured-dynamics -------------------------------------------------------------------


def structured_factors(model, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A_i, B_i, C_i) as the chapter identifies them at X (n, d): LTI SSM (A, B, C); Elman RNN
    (Φ_i W, Φ_i U, C); selective SSM and SSD with one N-state per channel (decays e^{Δ_t[q] A[q]},
    resp. a^h_t of the channel's head h)."""
    P, n = _parameters(model), len(X)
    if isinstance(model, LinearSSM):
        return tuple(np.repeat(P[name][None], n, 0) for name in "ABC")
    if isinstance(model, ElmanRNN):
        Phi = [np.diag(ref.tanh_secant(z)) for z in ref.rnn_pre_activations(P["W"], P["U"], X)]
        return (np.array([D @ P["W"] for D in Phi]), np.array([D @ P["U"] for D in Phi]),
                np.repeat(P["C"][None], n, 0))
    if isinstance(model, SelectiveSSM):
        A, delta, Bt, Ct = ref.selective_parts(P["A_log"], P["W_delta"], P["dt_bias"], P["W_B"], P["W_C"], X)
        decay, drive = np.exp(delta[:, :, None] * A[None]), delta[:, :, None] * Bt[:, None, :]
        return ref.channel_factors(decay, drive, Ct, np.eye(model.d))
    if isinstance(model, SSD):
        delta, a, Bt, Ct = ref.ssd_parts(P["A_log"], P["W_delta"], P["dt_bias"], P["W_B"], P["W_C"], X)
        head = np.arange(model.d) // (model.d // model.H)  # the head of each channel
        decay = np.repeat(a[:, head][:, :, None], model.N, 2)
        return ref.channel_factors(decay, delta[:, head][:, :, None] * Bt[:, None, :], Ct, P["W_O"])
    raise NotImplementedError(f"{type(model).__name__} is not given structured dynamics in the chapter")


def structured_error(model, X: np.ndarray) -> float:
    """Largest per-item error over X (b, n, d) of lib's operator against the product formula and
    of lib's forward pass against the recurrence, with the model's factors."""
    worst = 0.0
    for x in X:
        As, Bs, Cs = structured_factors(model, x)
        worst = max(worst, ref.itemwise_error(_lib(model.operator, x), ref.structured_operator(As, Bs, Cs), 2),
                    ref.itemwise_error(_lib(model, x), ref.structured_recurrence(As, Bs, Cs, x), 1))
    return worst


# -- interaction ranks as the chapter states them -----------------------------------------------


def score_directions_independent(model, seed: int = 0) -> bool:
    """Whether W_K^{hᵀ} W_Q^h x*, h = 1..H, are independent at a random token x*."""
    P, x = _parameters(model), np.random.default_rng(seed).standard_normal(model.d)
    return ref.numerical_rank(np.array([P["W_K"][h].T @ (P["W_Q"][h] @ x) for h in range(model.H)])) == model.H


def coefficient_rank(model, inputs: np.ndarray) -> int:
    """dim span{(α^1_ij(X), …, α^H_ij(X)) : i, j, X ∈ inputs (b, n, d)} (prop-factorized-rank)."""
    return ref.numerical_rank(np.concatenate([coefficients(model, x)[0].reshape(-1, len(x) ** 2).T
                                              for x in inputs]))


def value_rank(model) -> int:
    """dim span{V_1, …, V_H} of a factorized model."""
    return ref.numerical_rank(coefficients(model, np.zeros((1, model.d)))[1])


def resolvent_rank(A: np.ndarray, B: np.ndarray, C: np.ndarray, rtol: float = 1e-10) -> int:
    """k of prop-lti-ssm for n >= N without powers of A or lags: dim span{Re, Im C(z_s I − A)⁻¹B}
    at 2N + 1 points z_s on the circle |z| = 1 + ρ(A), by linear solves.

    The resolvent at m_A (or more) distinct points off the spectrum spans the polynomials in A
    (partial fractions), so these blocks span span{L_ℓ : ℓ >= 0}, which is span{L_ℓ : ℓ < n} once
    n >= m_A (Cayley–Hamilton). Rank: singular values above rtol · the largest.
    """
    N = A.shape[0]
    s = 2 * N + 1
    points = (1 + np.abs(np.linalg.eigvals(A)).max()) * np.exp(2j * np.pi * (np.arange(s) + 0.5) / s)
    blocks = np.stack([(C @ np.linalg.solve(z * np.eye(N) - A, B)).ravel() for z in points])
    return ref.numerical_rank(np.concatenate([blocks.real, blocks.imag]), rtol)


def lti_rank_systems(rng: np.random.Generator, N: int = 4) -> dict[str, tuple[np.ndarray, ...]]:
    """(A, B, C) of LTI SSMs whose k lies below min(N, n, pd) or has to be counted with care:
    a double eigenvalue twice (m_A = 2), a Jordan block, an uncontrollable mode, rank-one B and C,
    a nilpotent shift with p = d = 1, C = 0, and N = 2pd near the unit circle. d = p = N except
    where the name says otherwise."""
    def gauss(*shape):
        return rng.standard_normal(shape)

    P = gauss(N, N)
    repeated = P @ np.diag(np.repeat([0.5, -0.5], N // 2)) @ np.linalg.inv(P)
    jordan = 0.7 * np.eye(N) + np.eye(N, k=1)
    uncontrollable = gauss(N, N)
    uncontrollable[-1] = 0.0                                        # the last mode is not driven
    near = gauss(2 * N, 2 * N)
    return {
        "double eigenvalues ±0.5 (m_A = 2)": (repeated, gauss(N, N), gauss(N, N)),
        f"Jordan block, λ = 0.7 (m_A = {N})": (jordan, gauss(N, N), gauss(N, N)),
        "diagonal A, one mode not driven": (np.diag(np.linspace(0.9, -0.3, N)), uncontrollable, gauss(N, N)),
        "rank-one B and C": (jordan.T * 0.9, np.outer(gauss(N), gauss(N)), np.outer(gauss(N), gauss(N))),
        "nilpotent shift, p = d = 1": (np.eye(N, k=1), gauss(N, 1), gauss(1, N)),
        "C = 0": (jordan, gauss(N, N), np.zeros((N, N))),
        f"N = {2 * N}, p = d = 2, ρ(A) = 0.99": (0.99 * near / np.abs(np.linalg.eigvals(near)).max(),
                                                 gauss(2 * N, 2), gauss(2, 2 * N)),
    }


def minimal_polynomial_degree(A: np.ndarray, rtol: float = 1e-10) -> int:
    """m_A = dim span{I, A, …, A^N}, by the numerical rank of the unit-normalised vec(A^ℓ)."""
    powers, P = [], np.eye(A.shape[0])
    for _ in range(A.shape[0] + 1):
        norm = np.linalg.norm(P)
        if norm == 0:
            break
        powers.append(P.ravel() / norm)
        P = A @ P
    return ref.numerical_rank(np.array(powers), rtol)


def lti_rank_rows(systems: dict, inputs: dict[int, np.ndarray], measure) -> list[dict]:
    """prop-lti-ssm's exact rank on each system of `lti_rank_systems`: the rank `measure(model,
    X)` measures (lib's interaction rank of lib's operator) against `resolvent_rank` (numpy, no
    lags), with the bound min(m_A, n, rank C · rank B) (m_A by `minimal_polynomial_degree`, ranks by
    numpy); inputs {d: X (b, n, d)} with n >= N. "holds": measured = k <= the bound."""
    rows = []
    for name, (A, B, C) in systems.items():
        X = inputs[B.shape[1]]
        N, n = A.shape[0], X.shape[1]
        bound = min(minimal_polynomial_degree(A), n, np.linalg.matrix_rank(C) * np.linalg.matrix_rank(B))
        k, rank = resolvent_rank(A, B, C), int(measure(LinearSSM(A, B, C), X))
        rows.append({"system": name, "N": N, "p × d": f"{C.shape[0]} × {B.shape[1]}",
                     "min(m_A, n, rk C·rk B)": int(bound), "k (resolvents)": k, "measured rank": rank,
                     "proposition": "prop-lti-ssm", "holds": rank == k <= bound})
    return rows


def with_step_rank(model, rank: int):
    """The selective scan `model` with W_Δ replaced by its best rank-`rank` approximation (SVD), as
    Mamba's rank-⌈d_model/16⌉ step projection: outside prop-selective-ssm's exactness hypothesis."""
    P = _parameters(model)
    left, sigma, right = np.linalg.svd(P["W_delta"])
    W_delta = (left[:, :rank] * sigma[:rank]) @ right[:rank]
    return SelectiveSSM(P["A_log"], W_delta, P["dt_bias"], P["W_B"], P["W_C"])


def predicted_rank(model, inputs: np.ndarray) -> tuple[str, int, str]:
    """(relation, value, rule): what the proposition says of the interaction rank over inputs
    (b, n, d) — "=" where the page gives it exactly (its conditions checked in numpy), "≤" for a
    bound."""
    b, n, d = inputs.shape
    tokens, P = inputs.reshape(-1, d), _parameters(model)
    if isinstance(model, Dense):
        return "=", int(np.any(P["W"] != 0)), "1 (W ≠ 0)"
    if isinstance(model, FeedForward):
        return "=", ref.ffn_rank(P["W1"], P["W2"], tokens), "dim span{W₂ Π W₁ : Π realised}"
    if isinstance(model, CausalConv1d):
        return "=", ref.numerical_rank(P["K"][: min(model.r, n)]), "dim span{K_ℓ : ℓ < min(r, n)}"
    if isinstance(model, ElmanRNN):
        return "≤", int(np.linalg.matrix_rank(P["C"]) * np.linalg.matrix_rank(P["U"])), "rank C · rank U"
    if isinstance(model, LinearSSM):
        if n < model.N:
            return "≤", min(model.N, n, model.p * model.d), "min(N, n, pd)"
        return "=", resolvent_rank(P["A"], P["B"], P["C"]), "k, from C(zI − A)⁻¹B (n ≥ N)"
    if isinstance(model, KANLayer):
        return "≤", model.p * model.d, "pd"
    if isinstance(model, SelectiveSSM):
        ok = ref.quadratic_form_nonzero(P["W_B"], P["W_C"]) and np.linalg.matrix_rank(P["W_delta"]) == d
        return ("=" if ok and len(tokens) >= d else "≤"), d, "d (W_Δ invertible, ω ≢ 0)"
    H = model.H
    if isinstance(model, SSD):
        ok = (ref.quadratic_form_nonzero(P["W_B"], P["W_C"]) and np.linalg.matrix_rank(P["W_delta"]) == H
              and all(np.any(V != 0) for V in ref.ssd_values(P["W_O"], H)))
        return ("=" if ok and len(tokens) >= H else "≤"), H, "H (rank W_Δ = H, W_O Π_h ≠ 0, ω ≢ 0)"
    values = ref.attention_values(P["W_V"], P["W_O"])
    if isinstance(model, SoftmaxAttention):
        if n == 1:
            return "=", int(np.any(values.sum(0) != 0)), "1 (n = 1)"
        ok = (ref.numerical_rank(values) == H and b >= H and model.position_bias is None
              and score_directions_independent(model))
        return ("=" if ok else "≤"), H, "H (n ≥ 2, V_h and W_Kᵀ W_Q x* independent)"
    if isinstance(model, LinearAttention):
        if ref.numerical_rank(values) < H:
            return "≤", H, "H"
        return "=", coefficient_rank(model, inputs), "dim span{α_ij(X)} (V_h independent)"
    raise NotImplementedError(f"no rank statement for {type(model).__name__}")


def zoo_claims(label: str, model, n: int) -> tuple[bool, int, bool]:
    """(input-dependent, rank, exact) that proposition `label` records for a zoo instance on
    length n >= 2, the rank measured with lib's spans: exact where the page gives it for the
    zoo's random parameters, else a bound. (Causality is the model's `causal`.)"""
    if label == "prop-conv":
        return False, operator_span(model.K[: min(model.r, n)]).dim, True
    if label == "prop-lti-ssm":
        return False, operator_span(model.lags(n)).dim, True
    if label == "prop-rnn":
        C, U = model.C.numpy(force=True), model.U.numpy(force=True)
        return True, int(np.linalg.matrix_rank(C) * np.linalg.matrix_rank(U)), False
    if label == "prop-dense":
        return False, 1, True
    if label == "prop-ffn":
        return True, min(model.m, model.p * model.d), False
    if label == "prop-kan":
        return True, model.p * model.d, False
    if label == "prop-selective-ssm":
        return True, model.d, True
    return True, model.H, label != "prop-linear-attention"  # SSD, softmax and linear attention


# -- the notebook's tables and checks (rows are dicts) ------------------------------------------


def agreement_rows(zoo, families: dict[str, np.ndarray]) -> list[dict]:
    """One row per (instance, input family): `agreement`'s three errors, the tolerance, the
    largest error and that over the tolerance. families: {family: inputs (b, n, d)}."""
    rows = []
    for name, label, model in zoo:
        for family, X in families.items():
            errors = agreement(model, X)
            largest = max(errors.values())
            rows.append({"architecture": name, "proposition": label, "inputs": family, **errors,
                         "tolerance": TOLERANCE, "largest": largest, "largest / tolerance": largest / TOLERANCE})
    return rows


def rank_rows(zoo, measured: dict[str, int], inputs: np.ndarray) -> list[dict]:
    """One row per instance: the page's rank statement (`predicted_rank`) against the rank
    measured by lib ({name: rank}); "holds" is equality for "=", the bound for "≤"."""
    rows = []
    for name, label, model in zoo:
        relation, value, rule = predicted_rank(model, inputs)
        rank = int(measured[name])
        rows.append({"architecture": name, "proposition": label, "page's rank": rule, "relation": relation,
                     "page's value": value, "measured rank": rank,
                     "holds": rank == value if relation == "=" else rank <= value})
    return rows


def worst_row(rows: list[dict], error: str = "largest") -> dict:
    """The row whose `error` is largest relative to its own "tolerance"."""
    return max(rows, key=lambda row: row[error] / row["tolerance"])


def proposition_checks(agreement: list[dict], ranks: list[dict]) -> list[tuple[str, float, float, str]]:
    """(label, discrepancy, tolerance, what) for `run.check`, per proposition of the agreement rows:
    its largest error on the family closest to the tolerance (`worst_row`), plus 1 for each of its
    rank statements that fails."""
    checks = []
    for label in dict.fromkeys(row["proposition"] for row in agreement):
        worst = worst_row([row for row in agreement if row["proposition"] == label])
        misses = sum(not row["holds"] for row in ranks if row["proposition"] == label)
        what = (f"largest per-item relative error of lib's operator and forward pass against "
                f"the numpy formulas, over the input families (worst: {worst['inputs']}), "
                f"+ rank statements missed ({misses})")
        checks.append((label, worst["largest"] + misses, worst["tolerance"], what))
    return checks


def factorized_rank_rows(zoo, measured: dict[str, int], inputs: np.ndarray) -> list[dict]:
    """prop-factorized-rank per factorized instance: H, dim span{V_h}, dim span{α_ij(X)} over
    inputs (b, n, d) and the rank measured by lib ({name: rank})."""
    return [{"architecture": name, "heads H": getattr(model, "H", 1), "dim span{V_h}": value_rank(model),
             "dim span{α_ij(X)}": coefficient_rank(model, inputs), "measured": int(measured[name])}
            for name, _, model in zoo]


def factorized_rank_misses(rows: list[dict]) -> int:
    """Rows contradicting prop-factorized-rank: a measured rank above H, or, with independent V_h
    (dim span{V_h} = H), one that differs from dim span{α_ij}."""
    return sum(r["measured"] > r["heads H"]
               or (r["dim span{V_h}"] == r["heads H"] and r["measured"] != r["dim span{α_ij(X)}"])
               for r in rows)


def structured_rows(zoo, families: dict[str, np.ndarray], factor_sizes, rng: np.random.Generator) -> list[dict]:
    """prop-structured-dynamics: the product formula against impulses for arbitrary factors of
    each size (N, d, p) (drawn from rng in turn, length n of the first family), then
    `structured_error` of each instance on each family. Columns: system, inputs, error, tolerance."""
    n = next(iter(families.values())).shape[1]
    rows = []
    for sizes in factor_sizes:
        As, Bs, Cs = ref.adversarial_factors(n, *sizes, rng)
        error = ref.itemwise_error(ref.structured_operator(As, Bs, Cs), ref.impulse_operator(As, Bs, Cs), 2)
        rows.append({"system": f"arbitrary factors (N, d, p) = {tuple(sizes)}", "inputs": "impulses",
                     "error": error, "tolerance": TOLERANCE})
    for name, _, model in zoo:
        for family, X in families.items():
            rows.append({"system": name, "inputs": family, "tolerance": TOLERANCE,
                         "error": structured_error(model, X)})
    return rows


# -- prop-discretisation --------------------------------------------------------------------------


def discretisation_rows(discretise, systems, steps) -> list[dict]:
    """prop-discretisation per system of `reference.continuous_systems`, method and step: column
    errors of lib's Ā, B̄ against RK4 (zoh) and an explicit inverse (bilinear), and ρ(Ā) against
    the mapped eigenvalues of A_c. discretise(A_c, B_c, C, step, method=) -> a LinearSSM
    (`LinearSSM.from_continuous`)."""
    routes = {"bilinear": ref.bilinear, "zoh": ref.rk4_flow}
    rows = []
    for name, (_, A_c, B_c, C) in zip(ref.system_names(systems), systems):
        for method, route in routes.items():
            for step in steps:
                model = discretise(A_c, B_c, C, float(step), method=method)
                A_bar, B_bar = route(A_c, B_c, step)
                rows.append({"system": name, "method": method, "step": float(step),
                             "Ā error": ref.column_error(model.A.numpy(force=True), A_bar),
                             "B̄ error": ref.column_error(model.B.numpy(force=True), B_bar),
                             "ρ(Ā)": float(model.spectral_radius),
                             "ρ mapped": ref.mapped_spectral_radius(A_c, step, method)})
    return rows


def discretisation_check(rows: list[dict]) -> tuple[float, str]:
    """(discrepancy, what) of prop-discretisation: the largest Ā, B̄ column error and relative gap
    |ρ(Ā)/ρ mapped − 1|, plus 1 for each Hurwitz system with ρ(Ā) >= 1."""
    largest = max(max(r["Ā error"], r["B̄ error"], abs(r["ρ(Ā)"] / r["ρ mapped"] - 1)) for r in rows)
    unstable = sum(r["system"].startswith("Hurwitz") and r["ρ(Ā)"] >= 1 for r in rows)
    what = ("largest column error of Ā, B̄ against RK4 / an explicit inverse and relative gap of "
            f"ρ(Ā) to the mapped eigenvalues + Hurwitz systems with ρ(Ā) ≥ 1 ({unstable})")
    return largest + unstable, what


# -- around the cores: residual attention blocks, SSD's skip, an LTI feed-through ---------------

LN_EPS = 1e-5  # torch.nn.LayerNorm's default


def pre_norm(X: np.ndarray, gain: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bias-free pre-LN of tokens X (n, d): z_j = diag(gain) P_c x_j / s(x_j), P_c = I − 11ᵀ/d,
    s(x) = (‖P_c x‖²/d + LN_EPS)^½. Returns (Z, s)."""
    centred = X - X.mean(axis=-1, keepdims=True)
    s = np.sqrt((centred**2).mean(axis=-1) + LN_EPS)
    return gain * centred / s[:, None], s


def residual_blocks(model, X: np.ndarray, gain: np.ndarray | None = None) -> np.ndarray:
    """{prf:ref}`prop-residual-attention`: the operator (n, n, d, d) of the block x_i + f(Z)_i for a
    lib attention layer f (p = d), Z = X or the pre-LN of X: δ_ij I + 𝒲^f_ij(Z) M_j with M_j = I,
    resp. diag(gain) P_c / s(x_j); 𝒲^f from lib."""
    n, d = X.shape
    if gain is None:
        Z, M = X, np.broadcast_to(np.eye(d), (n, d, d))
    else:
        Z, s = pre_norm(X, gain)
        M = (gain[:, None] * (np.eye(d) - 1.0 / d))[None] / s[:, None, None]
    W = np.einsum("ijpq,jqd->ijpd", _lib(model.operator, Z), M)
    return W + np.eye(n)[:, :, None, None] * np.eye(d)


def residual_forward(model, X: np.ndarray, gain: np.ndarray | None = None) -> np.ndarray:
    """x_i + f(Z)_i with f computed by the reference formulas (numpy, never lib)."""
    Z = X if gain is None else pre_norm(X, gain)[0]
    return X + forward(model, Z)


def residual_rows(blocks: dict, inputs: np.ndarray) -> list[dict]:
    """Per residual block (name → (model, gain, causal sums claimed)): its measured interaction rank
    over `inputs` (b, n, d) against H + 1, the identity error Σ_j 𝒲_ij x_j vs the usual computation,
    and, where claimed, the largest deviation of the row sums Σ_{j<=i} 𝒲_ij from I + Σ_h V_h."""
    rows = []
    for name, (model, gain, sums) in blocks.items():
        ops, identity, deviation = [], 0.0, float("nan")
        P = _parameters(model)
        values = np.einsum("hpv,hvd->pd", P["W_O"], P["W_V"]) + np.eye(model.d)
        for X in inputs:
            W = residual_blocks(model, X, gain)
            ops.append(W.reshape(-1, *W.shape[2:]))
            y = np.einsum("ijpd,jd->ip", W, X)
            identity = max(identity, ref.itemwise_error(y, residual_forward(model, X, gain), 1))
            if sums:
                gap = np.abs(W.sum(axis=1) - values).max() / np.abs(values).max()
                deviation = gap if np.isnan(deviation) else max(deviation, gap)
        rank = operator_span(np.concatenate(ops)).dim
        rows.append({"block": name, "heads H": model.H, "measured rank": rank,
                     "identity error": identity, "row sums − (I + Σ V_h)": deviation})
    return rows


def residual_check(rows: list[dict]) -> tuple[float, str]:
    """(discrepancy, what) of prop-residual-attention: the largest identity error and row-sum
    deviation, plus 1 for each block whose measured rank is not H + 1."""
    errors = [r["identity error"] for r in rows] + [r["row sums − (I + Σ V_h)"] for r in rows
                                                    if not np.isnan(r["row sums − (I + Σ V_h)"])]
    misses = sum(r["measured rank"] != r["heads H"] + 1 for r in rows)
    what = ("largest relative error of Σ_j 𝒲_ij x_j against the block computed the usual way and of "
            f"the row sums against I + Σ_h V_h, + blocks whose measured rank is not H + 1 ({misses})")
    return max(errors) + misses, what


def ssd_skip_blocks(model, D: np.ndarray, X: np.ndarray) -> np.ndarray:
    """{prf:ref}`prop-ssd-skip`: lib's SSD operator at X plus δ_ij Σ_h D_h W_O Π_h, (n, n, p, d)."""
    values = _lib(lambda _: model.values(), X)  # V_h = W_O Π_h, (H, p, d)
    n = X.shape[0]
    return _lib(model.operator, X) + np.eye(n)[:, :, None, None] * np.einsum("h,hpd->pd", D, values)


def ssd_skip_forward(model, D: np.ndarray, X: np.ndarray) -> np.ndarray:
    """The SSD core by the reference recurrence plus the skip W_O concat_h(D_h x_t^(h)), in numpy."""
    P = _parameters(model)
    per_channel = np.repeat(D, model.d // model.H)
    return forward(model, X) + (X * per_channel) @ P["W_O"].T


def ssd_skip_row(model, D: np.ndarray, inputs: np.ndarray) -> dict:
    """Measured rank of SSD + skip over `inputs` (b, n, d) and the identity error."""
    ops, identity = [], 0.0
    for X in inputs:
        W = ssd_skip_blocks(model, D, X)
        ops.append(W.reshape(-1, *W.shape[2:]))
        y = np.einsum("ijpd,jd->ip", W, X)
        identity = max(identity, ref.itemwise_error(y, ssd_skip_forward(model, D, X), 1))
    return {"heads H": model.H, "measured rank": operator_span(np.concatenate(ops)).dim,
            "identity error": identity}


def feedthrough_rank(A: np.ndarray, B: np.ndarray, C: np.ndarray, D: np.ndarray, n: int,
                     rtol: float = 1e-10) -> tuple[int, float]:
    """An LTI SSM with feed-through, y_i = C s_i + D x_i: (k, err). k = dim span{CB + D, CAB, …,
    CA^{n−1}B} by numpy's rank; err the largest gap between these lags and those of the augmented
    LTI SSM A' = diag(A, 0), B' = [B; I], C' = [C, D] (state N + d) computed by lib."""
    N, d = B.shape
    lags = ref.lti_lags(A, B, C, n)
    lags[0] = lags[0] + D
    A2 = np.block([[A, np.zeros((N, d))], [np.zeros((d, N + d))]])
    augmented = LinearSSM(A2, np.vstack([B, np.eye(d)]), np.hstack([C, D]))
    gap = np.abs(augmented.lags(n).numpy(force=True) - lags).max() / np.abs(lags).max()
    M = lags.reshape(n, -1)
    k = int(np.linalg.matrix_rank(M, tol=rtol * np.linalg.norm(M, 2)))
    return k, float(gap)


def residual_head_example(radius: float, n: int) -> tuple[int, float]:
    """One head V = J with coefficients c_ℓ = radius^ℓ plus the identity path, δ_ij I + [j<=i] ρ^{i−j} J
    (numpy), against lib's operator of the LTI SSM A = diag(0, 0, ρ, ρ), B = [I; J], C = [I, I]:
    (the SSM's interaction rank k_n, largest relative gap between the two operators)."""
    J = np.array([[0.0, -1.0], [1.0, 0.0]])
    A = np.diag([0.0, 0.0, radius, radius])
    ssm = LinearSSM(A, np.vstack([np.eye(2), J]), np.hstack([np.eye(2), np.eye(2)]))
    W = _lib(ssm.operator, np.zeros((n, 2)))
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    coefficient = np.where(lag >= 0, float(radius) ** np.maximum(lag, 0), 0.0)
    head = np.eye(n)[:, :, None, None] * np.eye(2) + coefficient[:, :, None, None] * J
    k = operator_span(W.reshape(-1, 2, 2)).dim
    return k, float(np.abs(W - head).max() / np.abs(head).max())


# -- ranks below the structural maximum, and a rank-one step projection -------------------------


def rank_one_step(model, u: np.ndarray, bias: np.ndarray, seed: int = 0):
    """The selective scan `model` with W_Δ = u vᵀ (v a fixed random direction) and dt_bias = bias."""
    P = _parameters(model)
    v = np.random.default_rng(seed).standard_normal(model.d)
    return SelectiveSSM(P["A_log"], np.outer(u, v), bias, P["W_B"], P["W_C"])


def diagonal_block_rank(model, inputs: np.ndarray) -> int:
    """dim span{𝒲_ii(X)} over the diagonal blocks only (lib's operator, inputs (b, n, d)): the part
    of the interaction rank that the softplus functions g_q govern in the selective scan. Singular
    values count above 1e-10 times the largest of the whole operator, so zero blocks count 0."""
    W = _lib(model.operator, inputs)
    n = inputs.shape[1]
    diagonal = W[:, np.arange(n), np.arange(n)].reshape(n * len(W), -1)
    sigma = np.linalg.svd(diagonal, compute_uv=False)
    largest = np.linalg.svd(W.reshape(-1, diagonal.shape[1]), compute_uv=False)[0]
    return int((sigma > 1e-10 * largest).sum())  # the 1e-10 rule, against the whole operator


def below_maximum(zoo) -> list[tuple[str, str, object, int]]:
    """(name, label, model, rank fixed in advance) of instances built from the zoo's so that the
    exact interaction rank lies below the structural maximum (pd, d, min(r, n, pd), H):
    a ReLU layer whose W₁ repeats each of m/2 rows twice (m/2 distinct activations), a convolution
    whose last tap is the sum of the first two (r − 1), a selective scan whose channels 1 and 2
    share a constant step and their A rows (d − 1), and an SSD scan whose second head's value map
    W_O Π_2 is zero (1)."""
    models = {label: model for _, label, model in zoo}
    ffn, conv, scan = models["prop-ffn"], models["prop-conv"], models["prop-selective-ssm"]
    [ssd] = [model for _, label, model in zoo if label == "prop-ssd" and model.H == 2]
    P = {label: _parameters(model) for label, model in
         (("ffn", ffn), ("conv", conv), ("scan", scan), ("ssd", ssd))}
    half = ffn.m // 2
    W1 = np.repeat(P["ffn"]["W1"][:half], 2, axis=0)
    K = P["conv"]["K"].copy()
    K[-1] = K[0] + K[1]
    A_log = P["scan"]["A_log"]
    assert np.all(A_log[0] == A_log[1]), "channels 1 and 2 must share A (Mamba's init does)"
    equal_steps = rank_one_step(scan, np.array([0.0, 0.0, 1.0, 2.0]), np.array([0.1, 0.1, 0.2, -0.3]))
    W_O = P["ssd"]["W_O"].copy()
    W_O[:, ssd.d // 2:] = 0.0
    pd_ = dict(P["ssd"], W_O=W_O)
    dead_head = SSD(*(pd_[k] for k in ("A_log", "W_delta", "dt_bias", "W_B", "W_C", "W_O")))
    return [
        (f"ReLU layer, W₁ rows repeated ({half} distinct)", "prop-ffn", FeedForward(W1, P["ffn"]["W2"]), half),
        (f"convolution, K_{conv.r - 1} = K_0 + K_1", "prop-conv", CausalConv1d(K), conv.r - 1),
        ("selective scan, channels 1, 2: one constant step", "prop-selective-ssm", equal_steps, scan.d - 1),
        ("SSD scan, 2 heads, W_O Π_2 = 0", "prop-ssd", dead_head, 1),
    ]


def below_maximum_rows(instances, inputs: np.ndarray, measure) -> list[dict]:
    """Per instance of `below_maximum`: the value fixed in advance, the page's formula where it has
    one (`predicted_rank` "=", as text; else "–"), and the rank `measure(model, X)` measures; "holds" when
    the measured rank equals the fixed value (and the formula, where there is one)."""
    rows = []
    for name, label, model, fixed in instances:
        relation, value, _ = predicted_rank(model, inputs)
        formula = str(value) if relation == "=" else "–"
        rank = int(measure(model, inputs))
        rows.append({"architecture": name, "proposition": label, "fixed in advance": fixed,
                     "page's formula": formula, "measured rank": rank,
                     "holds": rank == fixed and formula in ("–", str(fixed))})
    return rows


def rank_one_step_rows(scan, inputs: np.ndarray, measure) -> list[dict]:
    """The selective scan with rank-one W_Δ = u vᵀ where the softplus functions g_q are linearly
    dependent — u = (1, −1, 2, −2), b = 0 and b = (.3, −.3, .6, −.6): softplus(t) − softplus(−t) = t
    gives 2(g₁ − g₂) − (g₃ − g₄) ≡ 0 — and ω ≡ 0 (W_B = I, W_C = Sᵀ, S antisymmetric, full W_Δ):
    the diagonal-block rank (fixed in advance: d − 1 where the g_q are dependent, 0 where ω ≡ 0)
    and the whole interaction rank (fixed in advance: d, which the diagonal blocks cannot give)."""
    d = scan.d
    u = np.array([1.0, -1.0, 2.0, -2.0])
    P = _parameters(scan)
    S = np.random.default_rng(7).standard_normal((d, d))
    S = S - S.T
    silent = SelectiveSSM(P["A_log"], P["W_delta"], P["dt_bias"], np.eye(d), S.T)
    cases = [("rank-one W_Δ, u = (1, −1, 2, −2), b = 0", rank_one_step(scan, u, np.zeros(d)), d - 1),
             ("rank-one W_Δ, u = (1, −1, 2, −2), b = (.3, −.3, .6, −.6)",
              rank_one_step(scan, u, np.array([0.3, -0.3, 0.6, -0.6])), d - 1),
             ("full W_Δ, ω ≡ 0 (W_Cᵀ W_B antisymmetric)", silent, 0)]
    rows = []
    for name, model, diagonal in cases:
        blocks, rank = diagonal_block_rank(model, inputs), int(measure(model, inputs))
        rows.append({"instance": name, "diagonal blocks, fixed": diagonal, "diagonal blocks": blocks,
                     "rank, fixed": d, "interaction rank": rank,
                     "proposition": "prop-selective-ssm", "holds": blocks == diagonal and rank == d})
    return rows


def threshold_rows(scales, measure, seed: int = 0, N: int = 9, width: int = 3, n: int = 12) -> list[dict]:
    """Where the 1e-10 rule undercounts: A = c·S (S the N×N down-shift), random B (N × width),
    C (width × N). The lags c^ℓ C S^ℓ B have exact span dimension k = rank of the unscaled C S^ℓ B
    (numpy, well conditioned), independent of c > 0; lib's measured rank (`measure(model, X)`)
    and `resolvent_rank` both drop once c^ℓ falls below about 1e-10 of the leading lag."""
    rng = np.random.default_rng(seed)
    B, C = rng.standard_normal((N, width)), rng.standard_normal((width, N))
    X = rng.standard_normal((2, n, width))
    S = np.eye(N, k=-1)
    exact = int(np.linalg.matrix_rank(np.stack([(C @ np.linalg.matrix_power(S, l) @ B).ravel()
                                                for l in range(n)])))
    return [{"c": float(c), "exact k": exact, "measured rank": int(measure(LinearSSM(c * S, B, C), X)),
             "k (resolvents)": resolvent_rank(c * S, B, C)} for c in scales]


# -- three ranks of one softmax head, and the block pattern of two operators ---------------------


def operator_matrix(W: np.ndarray) -> np.ndarray:
    """The operator (n, n, p, d) as the np × nd matrix 𝒲(X) of vec(Yᵀ) = 𝒲(X) vec(Xᵀ)."""
    n, _, p, d = W.shape
    return W.transpose(0, 2, 1, 3).reshape(n * p, n * d)


def head_ranks(head, X: np.ndarray, rtol: float = 1e-10) -> dict:
    """For one softmax head on one input X (n, d): the rank of its n × n attention matrix, the
    rank of its operator as an np × nd matrix, its interaction rank (lib's `interaction_rank`),
    the rank of its value map, and the largest gap between the operator matrix and α ⊗ V (the
    Kronecker form the page derives), relative to the largest entry."""
    alpha = _lib(head.weights, X)[0]  # (n, n): one head
    [V] = head.values().numpy(force=True)
    W = operator_matrix(_lib(head.operator, X))

    def rank(M):
        return int(np.linalg.matrix_rank(M, tol=rtol * np.linalg.norm(M, 2)))

    from lib import interaction_rank

    return {
        "n": X.shape[0], "p": V.shape[0], "d": V.shape[1],
        "attention matrix rank": rank(alpha),
        "operator matrix rank": rank(W),
        "interaction rank": interaction_rank(head, X[None]),
        "value map rank": rank(V),
        "Kronecker gap": float(np.abs(W - np.kron(alpha, V)).max() / np.abs(W).max()),
    }


def block_patterns(ssm, head, X: np.ndarray) -> list[dict]:
    """One row per block (i, j) (1-based) of an LTI SSM's and of one softmax head's operator on
    X (n, d): the lag i − j, the head's weight α_ij, and the largest gap of each block from its
    pattern — L_{i−j} (lib's lags) for the SSM, α_ij V for the head — relative to the largest
    block entry."""
    n = X.shape[0]
    W_ssm, W_head = _lib(ssm.operator, X), _lib(head.operator, X)
    lags = ssm.lags(n).numpy(force=True)
    alpha = _lib(head.weights, X)[0]
    [V] = head.values().numpy(force=True)
    scale_ssm, scale_head = np.abs(W_ssm).max(), np.abs(W_head).max()
    rows = []
    for i in range(n):
        for j in range(n):
            lag_block = lags[i - j] if j <= i else 0.0 * lags[0]
            rows.append({
                "i": i + 1, "j": j + 1, "lag": i - j, "alpha": float(alpha[i, j]),
                "SSM gap": float(np.abs(W_ssm[i, j] - lag_block).max() / scale_ssm),
                "head gap": float(np.abs(W_head[i, j] - alpha[i, j] * V).max() / scale_head),
            })
    return rows


# -- prop-mamba-block, prop-mamba2-block: the blocks as built ----------------------------------------


def moved(block, seed: int, scale: float = 0.3):
    """The block with every parameter moved by iid N(0, scale²) (A_log, D, the norm's weight too),
    so that no check rests on the initialisation's special values (A_log = log(1..N), D = 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return block


def built_blocks(d: int, state: int, seed: int, chunk: int = 5) -> dict:
    """name -> block: Mamba and Mamba-2 (2 groups, heads of width 2, SSD chunks of `chunk`), each
    without biases and with all of them, parameters moved off the initialisation."""
    blocks = {}
    for k, bias in enumerate((False, True)):
        tag = "biases" if bias else "no biases"
        blocks[f"Mamba, {tag}"] = moved(MambaBlock(d, state, bias=bias, conv_bias=bias, seed=seed + k), seed + 10 + k)
        blocks[f"Mamba-2, 2 groups, {tag}"] = moved(
            Mamba2Block(d, state, headdim=2, ngroups=2, bias=bias, conv_bias=bias, chunk_size=chunk, seed=seed + k),
            seed + 20 + k)
    return blocks


def block_families(families: dict[str, np.ndarray], d: int, K: int, chunk: int, rng) -> dict[str, np.ndarray]:
    """The chapter's input families plus the blocks' edges: all zero, n < d_conv, n = chunk + 1."""
    batch = len(families["random"])
    return families | {"zero": np.zeros((batch, 5, d)), "n < d_conv": rng.standard_normal((batch, K - 1, d)),
                       "n = chunk + 1": rng.standard_normal((batch, chunk + 1, d))}


def block_reference(block, X: np.ndarray):
    """(y, g, β) of one sequence by the numpy transcription of the block's proposition."""
    P = {name: value.numpy(force=True) for name, value in block.state_dict().items()}
    if isinstance(block, MambaBlock):
        return ref.mamba_block(P, X)
    return ref.mamba2_block(P, X, block.headdim, block.ngroups, block.norm.eps)


def block_rows(blocks: dict, families: dict[str, np.ndarray], checked: int = 3) -> list[dict]:
    """Per block and input family: the identity error Σ_j 𝒲_ij x_j + β_i against lib's fast route
    ("scan") over the batch, and the largest per-item relative error of lib's g, β and forward
    against numpy on the first `checked` sequences (the numpy loops are slow). Both per item."""
    rows = []
    for name, block in blocks.items():
        for family, inputs in families.items():
            X = torch.from_numpy(inputs)
            with torch.no_grad():
                g, beta, y = block.coefficients(X), block.offset(X), block(X, method="scan")
                U, V = (M.numpy() for M in block.factors())
                W = np.einsum("pq,bijq,qd->bijpd", U, g.numpy(), V)       # = block.operator(X)
                identity = ref.itemwise_error(np.einsum("bijpd,bjd->bip", W, inputs) + beta.numpy(), y.numpy(), 1)
                g = g.numpy()
            formula = 0.0
            for b, x in enumerate(inputs[:checked]):
                y_ref, g_ref, beta_ref = block_reference(block, x)
                formula = max(formula, ref.itemwise_error(g[b], g_ref, 1), ref.itemwise_error(beta[b].numpy(), beta_ref, 1),
                              ref.itemwise_error(y[b].numpy(), y_ref, 1))
            rows.append({"block": name, "inputs": family, "n": inputs.shape[1], "identity error": identity,
                         "formula error": formula})
    return rows


def transformers_rows(blocks: dict, batch: int, n: int, seed: int) -> list[dict]:
    """Each block against transformers' MambaMixer / Mamba2Mixer (torch path, offline, random config,
    the block's state dict loaded strictly): the relative error of the outputs on one batch."""
    from experiments.blocks import _transformers

    _transformers()  # quiet: no tqdm notice, no notice that the CUDA kernels are missing
    from transformers import Mamba2Config, MambaConfig
    from transformers.models.mamba.modeling_mamba import MambaMixer
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    rows = []
    for k, (name, block) in enumerate(blocks.items()):
        bias, conv_bias = block.in_proj.bias is not None, block.conv1d.bias is not None
        if isinstance(block, MambaBlock):
            config = MambaConfig(hidden_size=block.d_model, state_size=block.d_state, conv_kernel=block.d_conv,
                                 intermediate_size=block.d_inner, time_step_rank=block.dt_rank, use_bias=bias,
                                 use_conv_bias=conv_bias)
            mixer = MambaMixer(config, layer_idx=0)
        else:
            config = Mamba2Config(hidden_size=block.d_model, state_size=block.d_state, conv_kernel=block.d_conv,
                                  expand=block.d_inner // block.d_model, num_heads=block.nheads,
                                  head_dim=block.headdim, n_groups=block.ngroups, use_bias=bias,
                                  use_conv_bias=conv_bias, chunk_size=block.chunk_size,
                                  layer_norm_epsilon=block.norm.eps)
            mixer = Mamba2Mixer(config, layer_idx=0)
        mixer = mixer.to(torch.float64).eval()
        mixer.load_state_dict(block.state_dict(), strict=True)
        X = torch.from_numpy(np.random.default_rng(seed + k).standard_normal((batch, n, block.d)))
        with torch.no_grad():
            rows.append({"block": name, "reference": type(mixer).__name__,
                         "relative error": relative_error(block(X, method="scan"), mixer(X))})
    return rows


def jacobian_gap(block, X: np.ndarray) -> float:
    """‖J − 𝒲‖ / ‖J‖ at one sequence X (n, d): J by autograd through the block's fast forward."""
    X = torch.from_numpy(X)
    J = torch.autograd.functional.jacobian(lambda Z: block(Z, method="scan"), X).permute(0, 2, 1, 3)
    with torch.no_grad():
        return relative_error(block.operator(X), J)
