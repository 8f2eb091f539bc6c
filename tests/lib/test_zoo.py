"""architecture_zoo: one instance of every architecture of the framework chapter (lib.zoo).

Construction, the identity and causality only; each class's formulas are tested in its own module's
tests, and the chapter's rank predictions with experiments.framework.
"""

import numpy as np
import pytest
import torch

from lib import architecture_zoo, identity_error

ZOO = architecture_zoo(d=4, p=3, heads=2, state=5, kernel=2, seed=7)
IDS = [name for name, _, _ in ZOO]
NON_CAUSAL = {"softmax attention (2 heads, non-causal)"}


def test_zoo_has_the_twelve_instances_of_the_chapter():
    assert [label for _, label, _ in ZOO] == [
        "prop-dense", "prop-ffn", "prop-conv", "prop-rnn", "prop-lti-ssm", "prop-selective-ssm", "prop-ssd",
        "prop-ssd", "prop-softmax-attention", "prop-softmax-attention", "prop-linear-attention", "prop-kan"]
    kinds = [type(model).__name__ for _, _, model in ZOO]
    assert kinds == ["Dense", "FeedForward", "CausalConv1d", "ElmanRNN", "LinearSSM", "SelectiveSSM", "SSD", "SSD",
                     "SoftmaxAttention", "SoftmaxAttention", "LinearAttention", "KANLayer"]
    assert len(set(IDS)) == 12 and all(isinstance(name, str) for name in IDS)
    assert "causal convolution (r = 2)" in IDS and "LTI SSM (N = 5)" in IDS


@pytest.mark.parametrize("name,label,model", ZOO, ids=IDS)
def test_zoo_sizes_follow_the_arguments(name, label, model):
    assert model.d == 4 and model.p == (4 if label == "prop-selective-ssm" else 3)  # S6 is d → d
    assert model.dtype == torch.float64
    sizes = {"CausalConv1d": ("r", 2), "ElmanRNN": ("N", 5), "LinearSSM": ("N", 5), "SelectiveSSM": ("N", 5)}
    if type(model).__name__ in sizes:
        attribute, value = sizes[type(model).__name__]
        assert getattr(model, attribute) == value
    if "heads" in name:
        assert model.H == (1 if "1 head" in name else 2)
    if label == "prop-lti-ssm":
        assert model.spectral_radius == pytest.approx(0.8, rel=1e-12)
    if label in ("prop-selective-ssm", "prop-ssd"):  # steps Δ = softplus(dt_bias) in (0.1, 1)
        steps = torch.nn.functional.softplus(model.dt_bias.detach()).numpy()
        assert np.all((0.1 <= steps) & (steps <= 1.0))


def test_instance_k_is_drawn_with_seed_plus_k():
    # Instance 0, the dense layer: W = N(0, 1/d) draws of default_rng(seed); instance 4, the LTI SSM:
    # A a Gaussian of default_rng(seed + 4) rescaled to ρ = 0.8.
    W = np.random.default_rng(7).standard_normal((3, 4)) / 2
    np.testing.assert_array_equal(ZOO[0][2].W.numpy(force=True), W)
    A = np.random.default_rng(7 + 4).standard_normal((5, 5))
    A *= 0.8 / np.abs(np.linalg.eigvals(A)).max()
    np.testing.assert_allclose(ZOO[4][2].A.numpy(force=True), A, rtol=1e-15)


@pytest.mark.parametrize("name,label,model", ZOO, ids=IDS)
def test_zoo_models_obey_the_identity_and_are_causal_as_stated(name, label, model):
    X = torch.from_numpy(np.random.default_rng(11).standard_normal((3, 6, 4)))
    assert identity_error(model, X) < 1e-13
    with torch.no_grad():
        W = model.operator(X).numpy()
    above = np.triu(np.ones((6, 6), dtype=bool), 1)
    assert model.causal == (name not in NON_CAUSAL) == bool(np.all(W[:, above] == 0))


def test_zoo_defaults_are_the_chapter_sizes():
    zoo = architecture_zoo()
    assert len(zoo) == 12 and all(model.d == 4 and model.p == 4 for _, _, model in zoo)
    assert [type(m).__name__ for _, _, m in zoo] == [type(m).__name__ for _, _, m in ZOO]


@pytest.mark.parametrize("kwargs,error,match", [
    ({"d": 3, "heads": 2}, ValueError, "heads must divide d = 3"),
    ({"kernel": 0}, ValueError, "kernel must be >= 1"),
    ({"state": -1}, ValueError, "state must be >= 1"),
    ({"d": 2.0}, TypeError, "d must be an integer"),
    ({"p": True}, TypeError, "p must be an integer"),
    ({"heads": "2"}, TypeError, "heads must be an integer"),
    ({"seed": -1}, ValueError, "seed must be >= 0"),
    ({"seed": 1.5}, TypeError, "seed must be an integer"),
])
def test_zoo_bad_input_names_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        architecture_zoo(**kwargs)
