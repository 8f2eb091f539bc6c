"""The framework chapter's architecture instances against the plain-numpy references.

Every instance of `lib.zoo.architecture_zoo` (the ones the chapter's notebook measures, here at
another size and seed), plus a non-causal linear attention the zoo lacks, is compared with the
chapter's formulas transcribed in numpy (tests/reference_operators.py, which imports nothing
from lib): operator, forward pass and the identity y_i = Σ_j 𝒲_ij x_j on adversarial input
families; interaction ranks as equalities where the chapter claims them, computed from the
page's formulas in numpy, and as bounds only where it claims bounds.
"""

from __future__ import annotations

import numpy as np
import pytest

import reference_operators as ref
from lib import LinearAttention, interaction_rank, is_causal, relative_error
from lib.zoo import Architecture, architecture_zoo

ZOO = architecture_zoo(d=4, p=4, n=10, heads=2, state=4, seed=7)
EXTRA = [Architecture("linear attention (2 heads, non-causal)", "prop-linear-attention",
                      LinearAttention.random(4, 4, heads=2, causal=False, seed=30),
                      causal=False, input_dependent=True, rank_bound=2)]
ALL = ZOO + EXTRA
IDS = [a.name for a in ALL]


@pytest.fixture(scope="module")
def inputs():
    return np.random.default_rng(11).standard_normal((16, 10, 4))


def test_zoo_covers_every_proposition_of_the_chapter():
    labels = {a.label for a in ZOO}
    assert labels == {"prop-dense", "prop-ffn", "prop-conv", "prop-rnn", "prop-lti-ssm",
                      "prop-selective-ssm", "prop-ssd", "prop-softmax-attention",
                      "prop-linear-attention", "prop-kan"}
    assert all(isinstance(a, Architecture) for a in ZOO)


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_every_architecture_matches_the_reference_formulas_on_adversarial_inputs(arch):
    families = ref.input_families(10, 4, np.random.default_rng(3))
    ratio, errors = ref.worst_ratio(arch.model, families)
    assert ratio <= 1, errors


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_causality_is_as_the_proposition_says(arch, inputs):
    assert is_causal(arch.model.operator(inputs)) == arch.causal == arch.model.causal


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_input_dependence_is_as_the_proposition_says(arch, inputs):
    changes = [relative_error(arch.model.operator(x), arch.model.operator(inputs[0])) for x in inputs[1:4]]
    assert (max(changes) > 1e-8) == arch.input_dependent


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_interaction_rank_is_what_the_proposition_says(arch, inputs):
    # "=": the page's exact value, computed in numpy from the parameters (and the inputs, for the
    # ReLU layer's patterns and linear attention's weights); "≤": a bound, checked as one.
    relation, value, _ = ref.predicted_rank(arch.model, inputs)
    rank = interaction_rank(arch.model, inputs)
    if relation == "=":
        assert rank == value
    else:
        assert rank <= value
    assert relation == "=" or not arch.rank_exact  # the zoo never claims more than the page


@pytest.mark.parametrize("arch", [a for a in ZOO if a.rank_exact], ids=[a.name for a in ZOO if a.rank_exact])
def test_the_zoo_records_the_exact_ranks_the_reference_computes(arch, inputs):
    relation, value, _ = ref.predicted_rank(arch.model, inputs)
    assert (relation, value) == ("=", arch.rank_bound)


def test_which_ranks_the_chapter_claims_exactly():
    # Exact for ten of the twelve instances; the Elman RNN and the KAN layer carry bounds only.
    inputs = np.random.default_rng(0).standard_normal((8, 10, 4))
    relations = {a.name: ref.predicted_rank(a.model, inputs)[0] for a in ZOO}
    assert {name for name, r in relations.items() if r == "≤"} == {"Elman RNN (tanh)", "KAN layer"}


def test_lti_ssm_rank_is_k_from_an_independent_lag_computation():
    [arch] = [a for a in ZOO if a.label == "prop-lti-ssm"]
    A, B, C = arch.model.A, arch.model.B, arch.model.C
    lags = np.stack([C @ np.linalg.matrix_power(A, ell) @ B for ell in range(10)])
    sigma = np.linalg.svd(lags.reshape(10, -1), compute_uv=False)
    assert arch.rank_bound == int((sigma > 1e-10 * sigma[0]).sum()) == 4


def test_zoo_validates_its_arguments():
    with pytest.raises(ValueError, match="heads must divide d"):
        architecture_zoo(d=3, heads=2)
    with pytest.raises(ValueError, match="kernel must be >= 1"):
        architecture_zoo(kernel=0)
    with pytest.raises(TypeError, match="n must be an integer"):
        architecture_zoo(n=2.0)
