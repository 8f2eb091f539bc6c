"""Claims of the framework chapter, checked on every architecture instance of the zoo.

Each architecture's proposition predicts causality, input dependence and a bound on the
interaction rank; these tests measure all three independently of the zoo's declarations
(the operator itself, two inputs, and the span of the blocks).
"""

from __future__ import annotations

import numpy as np
import pytest

from lib import apply_operator, identity_error, interaction_rank, is_causal, relative_error
from lib.zoo import Architecture, architecture_zoo

ZOO = architecture_zoo(d=4, p=4, n=10, heads=2, state=4, seed=7)
IDS = [a.name for a in ZOO]


@pytest.fixture(scope="module")
def inputs():
    return np.random.default_rng(11).standard_normal((16, 10, 4))


def test_zoo_covers_every_proposition_of_the_chapter():
    labels = {a.label for a in ZOO}
    assert labels == {"prop-dense", "prop-ffn", "prop-conv", "prop-rnn", "prop-lti-ssm",
                      "prop-selective-ssm", "prop-ssd", "prop-softmax-attention",
                      "prop-linear-attention", "prop-kan"}
    assert all(isinstance(a, Architecture) for a in ZOO)


@pytest.mark.parametrize("arch", ZOO, ids=IDS)
def test_operator_identity_holds_for_every_architecture(arch, inputs):
    assert identity_error(arch.model, inputs) < 1e-12
    Y = arch.model(inputs[0])
    assert np.allclose(apply_operator(arch.model.operator(inputs[0]), inputs[0]), Y, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("arch", ZOO, ids=IDS)
def test_causality_is_as_the_proposition_says(arch, inputs):
    assert is_causal(arch.model.operator(inputs)) == arch.causal


@pytest.mark.parametrize("arch", ZOO, ids=IDS)
def test_input_dependence_is_as_the_proposition_says(arch, inputs):
    changes = [relative_error(arch.model.operator(x), arch.model.operator(inputs[0])) for x in inputs[1:4]]
    assert (max(changes) > 1e-8) == arch.input_dependent


@pytest.mark.parametrize("arch", ZOO, ids=IDS)
def test_interaction_rank_respects_the_proposition(arch, inputs):
    rank = interaction_rank(arch.model, inputs)
    if arch.rank_exact:
        assert rank == arch.rank_bound
    else:
        assert rank <= arch.rank_bound


def test_lti_ssm_rank_is_k_from_an_independent_lag_computation():
    [arch] = [a for a in ZOO if a.label == "prop-lti-ssm"]
    A, B, C = arch.model.A, arch.model.B, arch.model.C
    lags = np.stack([C @ np.linalg.matrix_power(A, ell) @ B for ell in range(10)])
    sigma = np.linalg.svd(lags.reshape(10, -1), compute_uv=False)
    assert arch.rank_bound == int((sigma > 1e-10 * sigma[0]).sum()) == 4


def test_zoo_rejects_heads_that_do_not_divide_d():
    with pytest.raises(ValueError, match="heads must divide d"):
        architecture_zoo(d=3, heads=2)
