"""Every architecture of the framework chapter, built at one size, with what its proposition predicts.

The framework chapter ({ref}`chap-framework`) writes nine architectures as interaction
operators. `architecture_zoo` builds one random instance of each (two for the attention-style
layers: one head and several), all with the same token widths d and p, and records what the
matching proposition says about it: causality, input dependence, and the interaction rank
({prf:ref}`def-operator-span`) — exactly where the proposition gives it (for the zoo's random
parameters, whose conditions hold), as an upper bound otherwise. The chapter's notebook and
the tests measure the same instances against these statements, computed again, independently
of lib, in tests/reference_operators.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import check_int
from .attention import LinearAttention, SoftmaxAttention
from .base import SequenceMap
from .layers import CausalConv1d, Dense, FeedForward, KANLayer
from .recurrent import ElmanRNN
from .spans import operator_span
from .ssm import SSD, LinearSSM, SelectiveSSM



@dataclass(frozen=True)
class Architecture:
    """One architecture instance and what its proposition predicts.

    Attributes:
        name: short human name, e.g. "softmax attention (2 heads)".
        label: the proposition it instantiates, e.g. "prop-softmax-attention".
        model: the instance (a SequenceMap with the zoo's d and p).
        causal: whether the proposition's operator is causal.
        input_dependent: whether the proposition's operator depends on X.
        rank_bound: the interaction rank the proposition gives for this instance over random
            inputs of length n (>= 2): its exact value if rank_exact, else an upper bound.
        rank_exact: True when the proposition gives the rank of this instance exactly. False
            for the ReLU layer and linear attention, whose exact ranks are formulas in the
            inputs (the activation patterns, resp. the weights α_ij, that they realise), and for
            the Elman RNN and the KAN layer, for which the chapter proves bounds only.
    """

    name: str
    label: str
    model: SequenceMap
    causal: bool
    input_dependent: bool
    rank_bound: int
    rank_exact: bool = False


def architecture_zoo(d: int = 4, p: int = 4, n: int = 12, heads: int = 2, state: int = 4,
                     kernel: int = 3, seed: Any = 0) -> list[Architecture]:
    """One random instance of every architecture of the framework chapter.

    Args:
        d: input token width (also the output width of the selective SSM, whose p = d).
        p: output token width of every other architecture.
        n: the sequence length the rank predictions refer to (the LTI SSM's k depends on it).
        heads: number of heads of the multi-head instances (SSD, softmax and linear attention);
            must divide d (SSD splits the channels into heads).
        state: state size N of the recurrent and state space models.
        kernel: kernel length r of the convolution.
        seed: seed of every instance's random parameters (instance i uses seed + i).

    Returns:
        A list of `Architecture`, in the order of the chapter's table.
    """
    d, p, n = check_int(d, "d"), check_int(p, "p"), check_int(n, "n")
    heads, state, kernel = check_int(heads, "heads"), check_int(state, "state"), check_int(kernel, "kernel")
    if d % heads:
        raise ValueError(f"heads must divide d = {d} (SSD splits channels into heads); got {heads}")
    seed = int(seed)
    full = p * d
    ffn = FeedForward.random(d, p, seed=seed + 1)
    conv = CausalConv1d.random(d, p, r=kernel, seed=seed + 2)
    rnn = ElmanRNN.random(state, d, p, spectral_radius=0.9, seed=seed + 3)
    ssm = LinearSSM.random(state, d, p, spectral_radius=0.8, seed=seed + 4)
    # prop-conv: exactly dim span{K_ℓ : ℓ < min(r, n)}; prop-lti-ssm: exactly k = dim span{L_0..L_{n-1}}.
    taps = operator_span(conv.kernel[:min(kernel, n)]).dim
    k = operator_span(ssm.lags(n)).dim
    # prop-rnn: at most rank C · rank U.
    rnn_bound = int(np.linalg.matrix_rank(rnn.C)) * int(np.linalg.matrix_rank(rnn.U))
    # Larger steps than Mamba's default make the selective decays visible on a short sequence.
    steps = (0.1, 1.0)
    return [
        Architecture("dense layer", "prop-dense", Dense.random(d, p, seed=seed),
                     causal=True, input_dependent=False, rank_bound=1, rank_exact=True),
        Architecture("ReLU feed-forward", "prop-ffn", ffn,
                     causal=True, input_dependent=True, rank_bound=min(ffn.m, full)),
        Architecture(f"causal convolution (r = {kernel})", "prop-conv", conv,
                     causal=True, input_dependent=False, rank_bound=taps, rank_exact=True),
        Architecture("Elman RNN (tanh)", "prop-rnn", rnn,
                     causal=True, input_dependent=True, rank_bound=rnn_bound),
        Architecture(f"LTI SSM (N = {state})", "prop-lti-ssm", ssm,
                     causal=True, input_dependent=False, rank_bound=k, rank_exact=True),
        Architecture("selective SSM (Mamba)", "prop-selective-ssm",
                     SelectiveSSM.random(d, N=state, step_range=steps, seed=seed + 5),
                     causal=True, input_dependent=True, rank_bound=d, rank_exact=True),
        Architecture("SSD (1 head)", "prop-ssd",
                     SSD.random(d, p, N=state, heads=1, step_range=steps, seed=seed + 6),
                     causal=True, input_dependent=True, rank_bound=1, rank_exact=True),
        Architecture(f"SSD ({heads} heads)", "prop-ssd",
                     SSD.random(d, p, N=state, heads=heads, step_range=steps, seed=seed + 7),
                     causal=True, input_dependent=True, rank_bound=heads, rank_exact=True),
        Architecture("softmax attention (1 head)", "prop-softmax-attention",
                     SoftmaxAttention.random(d, p, heads=1, seed=seed + 8),
                     causal=True, input_dependent=True, rank_bound=1, rank_exact=True),
        Architecture(f"softmax attention ({heads} heads, non-causal)", "prop-softmax-attention",
                     SoftmaxAttention.random(d, p, heads=heads, causal=False, seed=seed + 9),
                     causal=False, input_dependent=True, rank_bound=heads, rank_exact=True),
        Architecture(f"linear attention ({heads} heads)", "prop-linear-attention",
                     LinearAttention.random(d, p, heads=heads, seed=seed + 10),
                     causal=True, input_dependent=True, rank_bound=heads),
        Architecture("KAN layer", "prop-kan", KANLayer.random(d, p, seed=seed + 11),
                     causal=True, input_dependent=True, rank_bound=full),
    ]
