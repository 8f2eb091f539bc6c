"""The explorers' data files (_static/explore/*.js): equal to a fresh regeneration, and their
numbers equal to an independent route at a few grid points — the damped rotation's σ₂(G)² from a
numpy SVD of lags computed by matrix powers and from the chapter's 2×2 closed form, its line
checked by the error it leaves; H_ε from a numpy SVD of an S5-like system built from scratch,
and from `lib.heads_needed`."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg

from experiments import explore_data
from lib import heads_needed, s4d_ssm

FILES = {name: explore_data.OUT / f"{name}.js" for name in explore_data.NAMES}


def committed(name: str) -> dict:
    loaded, data = explore_data.load(FILES[name])
    assert loaded == name
    return data


def _unit(b, digits: int) -> np.ndarray:
    # One unit in the last of `digits` significant digits of b.
    b = np.abs(np.asarray(b, dtype=float))
    return 10.0 ** (np.floor(np.log10(np.where(b > 0, b, 1.0))) - digits + 1)


def _close(a, b, digits: int) -> bool:
    # Two roundings of one number: at most one unit apart in the last kept digit (a tie that two
    # machines round differently); values below 1e-12 count as 0.
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= _unit(b, digits) * (1 + 1e-9) + 1e-12))


def _rounds_to(shown, true, digits: int) -> bool:
    # `shown` is `true` rounded to `digits` significant digits: within half a unit (and 1e-9 of it
    # for the other route's rounding).
    shown, true = np.asarray(shown, dtype=float), np.asarray(true, dtype=float)
    return shown.shape == true.shape and bool(
        np.all(np.abs(shown - true) <= 0.5 * _unit(true, digits) * (1 + 1e-6) + 1e-9 * np.abs(true)))


@pytest.mark.parametrize("name", explore_data.NAMES)
def test_committed_data_equals_a_fresh_regeneration(name):
    data, fresh = committed(name), explore_data.rounded(name, explore_data.compute(name))
    assert data.keys() == fresh.keys()
    for key, value in fresh.items():
        digits = explore_data.DIGITS[name].get(key)
        if key == "direction":  # a line: φ and φ ± π are the same
            assert np.abs(np.sin(np.subtract(data[key], value))).max() < 1e-4, key
        elif digits is None:
            assert data[key] == value, key
        else:
            assert _close(data[key], value, digits), key


def test_data_files_are_small_scripts_that_set_book_explore():
    for name, path in FILES.items():
        text = path.read_text()
        assert len(text.encode()) < 300_000, f"{path.name}: {len(text.encode())} bytes"
        assert f'(window.BOOK_EXPLORE = window.BOOK_EXPLORE || {{}})["{name}"] = {{' in text


# -- the damped rotation --------------------------------------------------------------------------


def _rotation_lags(rho: float, theta: float, n: int) -> np.ndarray:
    A = rho * np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    lags, L = [], np.eye(2)
    for _ in range(n):
        lags.append(L)
        L = A @ L
    return np.array(lags)  # B = C = I


def _grid_points(data: dict) -> list[tuple[int, int]]:
    a0, b0 = data["initial"]
    rows, cols = len(data["radius"]), len(data["angle"])
    return [(a0, b0), (0, 7), (rows - 1, 13), (rows // 2, cols // 2), (5, 0), (rows - 2, cols - 1), (11, 29)]


def test_damped_rotation_initial_state_is_the_chapters_example():
    data, params = committed("damped-rotation"), explore_data.published("chapters/rank-gap/rank-gap.ipynb")
    a, b = data["initial"]
    assert data["radius"][a] == params["radius"] and data["angle"][b] == params["angle"]
    assert data["n"] == params["n"]
    assert data["radius"][0] == pytest.approx(0.5) and data["radius"][-1] == pytest.approx(0.999)
    assert data["angle"][0] == 0 and data["angle"][-1] == pytest.approx(math.pi)


def test_damped_rotation_numbers_equal_an_svd_of_the_lags_and_the_closed_form():
    data = committed("damped-rotation")
    n = data["n"]
    for a, b in _grid_points(data):
        rho, theta = data["radius"][a], data["angle"][b]
        lags = _rotation_lags(rho, theta, n)
        G = lags.reshape(n, 4) * np.sqrt(n - np.arange(n))[:, None]
        sigma = np.linalg.svd(G, compute_uv=False)
        energy = (sigma ** 2).sum()
        # The chapter's closed form: 2 Σ (n − ℓ) ρ^{2ℓ} [[c², cs], [cs, s²]] has eigenvalues σ₁², σ₂².
        ell = np.arange(n)
        c, s, w = np.cos(ell * theta), np.sin(ell * theta), 2 * (n - ell) * rho ** (2 * ell)
        M = np.array([[w @ (c * c), w @ (c * s)], [w @ (c * s), w @ (s * s)]])
        least = np.linalg.eigvalsh(M)[0]
        assert sigma[1] ** 2 == pytest.approx(least, rel=1e-9, abs=1e-10 * energy)
        shown_error, shown_relative = data["error"][a][b], data["relative"][a][b]
        if sigma[1] ** 2 < 1e-13 * energy:  # θ a multiple of π: one head is exact
            assert shown_error == 0 and shown_relative == 0
            continue
        assert _rounds_to(shown_error, sigma[1] ** 2, 4) and _rounds_to(shown_relative, sigma[1] ** 2 / energy, 4)
        # The points the widget draws, (ρ^ℓ cos ℓθ, ρ^ℓ sin ℓθ), are the lags' coordinates in I, J.
        J = np.array([[0.0, -1.0], [1.0, 0.0]])
        x, y = rho ** ell * c, rho ** ell * s
        assert np.allclose(lags, x[:, None, None] * np.eye(2) + y[:, None, None] * J, atol=1e-12)
        # The line drawn at φ leaves σ₂² (‖xI + yJ‖²_F = 2(x² + y²)): it is the best one.
        phi = data["direction"][a][b]
        distance = -x * math.sin(phi) + y * math.cos(phi)
        left = (2 * (n - ell) * distance ** 2).sum()
        assert left == pytest.approx(sigma[1] ** 2, rel=1e-3, abs=1e-9 * energy)


# -- heads needed ---------------------------------------------------------------------------------


def _s5_like_lags(N: int, width: int, rho: float, n: int, seed: int) -> np.ndarray:
    # The chapter's S5-like system, built here from its description: blocks [[−½, −πm], [πm, −½]],
    # m = 1..N/2; B_c, C Gaussian with variances 1/d, 1/N (numpy's default_rng(seed), B_c first);
    # zero-order hold with the step Δ = −2 ln ρ; lags C A^ℓ B by repeated multiplication.
    A_c = np.zeros((N, N))
    for m in range(1, N // 2 + 1):
        k = 2 * (m - 1)
        A_c[k:k + 2, k:k + 2] = [[-0.5, -math.pi * m], [math.pi * m, -0.5]]
    rng = np.random.default_rng(seed)
    B_c = rng.standard_normal((N, width)) / math.sqrt(width)
    C = rng.standard_normal((width, N)) / math.sqrt(N)
    step = -2 * math.log(rho)
    block = np.zeros((N + width, N + width))
    block[:N, :N], block[:N, N:] = A_c, B_c
    E = scipy.linalg.expm(step * block)
    A, B = E[:N, :N], E[:N, N:]
    lags, state = [], B
    for _ in range(n):
        lags.append(C @ state)
        state = A @ state
    return np.array(lags)


def test_heads_needed_initial_state_and_family_are_the_notebooks():
    data, params = committed("heads-needed"), explore_data.published("chapters/head-count/heads-needed.ipynb")
    assert (data["N"], data["width"], data["n"], data["init"], data["seed"]) == (
        max(params["states"]), params["width"], params["n"], params["init"], params["seed"])
    assert set(params["radii"]) | set(params["near_radii"]) <= set(data["radius"])
    a, b = data["initial"]
    assert data["radius"][a] == 0.99 and data["epsilon"][b] == 1e-2
    assert {1e-2, 1e-4, 1e-8} <= set(data["epsilon"])


@pytest.mark.parametrize("rho", [0.5, 0.9, 0.99, 0.9999])
def test_heads_needed_equals_an_svd_of_lags_built_from_scratch_and_lib(rho):
    data = committed("heads-needed")
    a = data["radius"].index(rho)
    n, N, width = data["n"], data["N"], data["width"]
    lags = _s5_like_lags(N, width, rho, n, data["seed"])
    G = lags.reshape(n, width * width) * np.sqrt(n - np.arange(n))[:, None]
    squares = np.linalg.svd(G, compute_uv=False) ** 2
    energy = squares.sum()
    tails = np.append(np.cumsum(squares[::-1])[::-1], 0.0) / energy  # tails[H] = Σ_{q>H} σ_q² / ‖G‖²
    shares = squares / energy
    shown = np.asarray(data["shares"][a])
    big = shares > 1e-9  # the widget's axis ends at 1e-10; far below, both routes are mostly rounding
    assert big.sum() >= 10
    assert _rounds_to(shown[big], shares[big], 3)
    assert _rounds_to(np.asarray(data["tails"][a])[tails > 1e-9], tails[tails > 1e-9], 3)
    assert data["window"][a] == pytest.approx(n * -2 * math.log(rho), rel=1e-3)
    ssm = s4d_ssm(N, width, rho, seed=data["seed"])
    for b, eps in enumerate(data["epsilon"]):
        by_definition = int(np.argmax(tails <= eps))  # the least H with Σ_{q>H} σ_q² <= ε ‖G‖²
        assert data["heads"][a][b] == by_definition, (rho, eps)
    for b in (0, len(data["epsilon"]) // 2, len(data["epsilon"]) - 1):
        assert data["heads"][a][b] == heads_needed(ssm, n, data["epsilon"][b])


# -- the chapters' own published numbers ----------------------------------------------------------


def test_widgets_initial_numbers_equal_the_chapters_result_tables():
    import pandas as pd

    root = explore_data.ROOT / "data" / "results"
    fits = pd.read_csv(root / "rank-gap" / "optimiser-fits.csv")
    row = fits[(fits["SSM"] == "damped rotation") & (fits["H"] == 1)].iloc[0]
    data = committed("damped-rotation")
    a, b = data["initial"]
    # σ₂(G)² of the notebook, and the L-BFGS fit that never forms G's SVD
    for value in (row["closed form"], row["L-BFGS"]):
        assert _rounds_to(data["error"][a][b], value, 4)
    assert _rounds_to(data["relative"][a][b], row["closed form / energy"], 4)
    table = pd.read_csv(root / "head-count" / "heads-needed.csv")
    data = committed("heads-needed")
    table = table[table["N"] == data["N"]]
    assert len(table) >= 18
    for _, line in table.iterrows():
        a, b = data["radius"].index(line["radius"]), data["epsilon"].index(line["epsilon"])
        assert data["heads"][a][b] == line["heads needed"], (line["radius"], line["epsilon"])
