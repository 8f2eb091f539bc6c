"""RelativeHeads and the factorized class (lib.factorized)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import LinearSSM, RelativeHeads, interaction_rank, operator_span, relative_error


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 8), H=st.integers(1, 3), d=st.integers(1, 3), p=st.integers(1, 3), seed=st.integers(0, 999))
def test_def_factorized_relative_heads_operator_and_forward(n, H, d, p, seed):
    model = RelativeHeads.random(H, 8, d, p, seed=seed)
    V, c = model.V, model.coefficients
    X = np.random.default_rng(seed).standard_normal((n, d))
    W = model.operator(X)
    Y = np.zeros((n, p))
    for i in range(n):
        for j in range(n):
            expected = sum(c[h, i - j] * V[h] for h in range(H)) if j <= i else np.zeros((p, d))
            np.testing.assert_allclose(W[i, j], expected, rtol=1e-13, atol=1e-15)
            Y[i] += expected @ X[j]
    np.testing.assert_allclose(model(X), Y, rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(model.values(), V)


def test_def_factorized_interaction_rank_equals_heads_for_generic_values():
    X = np.random.default_rng(0).standard_normal((2, 10, 3))
    for H in (1, 2, 4, 6):
        assert interaction_rank(RelativeHeads.random(H, 10, 3, 2, seed=H), X) == H


def test_relative_heads_reproduce_an_ssm_with_k_heads():
    # The sufficiency construction of the head-count theorem: a basis of span{L_ℓ}
    # as values and the coordinates of L_ℓ as coefficients.
    ssm = LinearSSM.random(3, 2, 2, seed=0)
    n = 20
    span = operator_span(ssm.lags(n))
    heads = RelativeHeads(span.basis, span.coefficients(ssm.lags(n)).T)
    assert heads.H == span.dim == 3
    X = np.random.default_rng(1).standard_normal((4, n, 2))
    assert relative_error(heads(X), ssm(X)) < 1e-12


def test_relative_heads_long_sequences_use_fft_and_agree():
    model = RelativeHeads.random(2, 1000, 3, 2, decay=0.999, seed=0)
    X = np.random.default_rng(0).standard_normal((1, 800, 3))
    fft = model(X)
    direct = np.einsum("ijh,hpd,bjd->bip", _toeplitz_np(model.coefficients, 800), model.V, X)
    assert relative_error(fft, direct) < 1e-12


def _toeplitz_np(c, n):
    lag = np.arange(n)[:, None] - np.arange(n)[None, :]
    return np.where((lag >= 0)[..., None], c.T[np.clip(lag, 0, None)], 0.0)


def test_relative_heads_validation():
    with pytest.raises(ValueError, match=r"coefficients must have shape \(H, n_max\) = \(2, "):
        RelativeHeads(np.zeros((2, 1, 1)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"V must have shape \(H, p, d\)"):
        RelativeHeads(np.zeros((2, 2)), np.zeros((2, 4)))


# -- prop-factorized-rank -------------------------------------------------------------------

@pytest.mark.parametrize("H", [1, 2, 3])
def test_prop_factorized_rank_every_block_lies_in_the_span_of_the_value_maps(H):
    from lib import SSD, LinearAttention, SoftmaxAttention

    rng = np.random.default_rng(H)
    inputs = rng.standard_normal((6, 7, 6))
    models = [RelativeHeads.random(H, 7, 6, 5, seed=H), SoftmaxAttention.random(6, 5, heads=H, seed=H),
              LinearAttention.random(6, 5, heads=H, seed=H), SSD.random(6, 5, N=4, heads=H, seed=H)]
    for model in models:
        values = operator_span(np.asarray(model.values()))
        blocks = np.asarray(model.operator(inputs)).reshape(-1, 5, 6)
        residual = np.linalg.norm(values.residual(blocks)) / np.linalg.norm(blocks)
        assert residual < 1e-12, type(model).__name__
        assert interaction_rank(model, inputs) <= H
