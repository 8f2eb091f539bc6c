"""One random instance of every architecture of the framework chapter, at one size."""

from __future__ import annotations

from ._validation import check_int
from .attention import LinearAttention, SoftmaxAttention
from .base import SequenceMap
from .layers import CausalConv1d, Dense, FeedForward, KANLayer
from .recurrent import ElmanRNN
from .ssm import SSD, LinearSSM, SelectiveSSM


def architecture_zoo(d: int = 4, p: int = 4, heads: int = 2, state: int = 4, kernel: int = 3,
                     seed: int = 0) -> list[tuple[str, str, SequenceMap]]:
    """(name, label of the proposition, model) for the twelve instances of {ref}`chap-framework`.

    Tokens d → p (the selective SSM is d → d); `heads` (dividing d) for SSD and attention,
    `state` N for the recurrent models, `kernel` r for the convolution; instance k uses seed + k.
    The selective SSM and SSD take steps in (0.1, 1), larger than Mamba's default, so that
    their decays show on short sequences.
    """
    d, p, heads = check_int(d, "d"), check_int(p, "p"), check_int(heads, "heads")
    state, kernel, seed = check_int(state, "state"), check_int(kernel, "kernel"), check_int(seed, "seed", 0)
    if d % heads:
        raise ValueError(f"heads must divide d = {d} (SSD splits channels into heads); got {heads}")
    steps = (0.1, 1.0)
    return [
        ("dense layer", "prop-dense", Dense.random(d, p, seed=seed)),
        ("ReLU feed-forward", "prop-ffn", FeedForward.random(d, p, seed=seed + 1)),
        (f"causal convolution (r = {kernel})", "prop-conv", CausalConv1d.random(d, p, r=kernel, seed=seed + 2)),
        ("Elman RNN (tanh)", "prop-rnn", ElmanRNN.random(state, d, p, spectral_radius=0.9, seed=seed + 3)),
        (f"LTI SSM (N = {state})", "prop-lti-ssm", LinearSSM.random(state, d, p, spectral_radius=0.8,
                                                                    seed=seed + 4)),
        ("selective SSM (Mamba)", "prop-selective-ssm", SelectiveSSM.random(d, N=state, step_range=steps,
                                                                             seed=seed + 5)),
        ("SSD (1 head)", "prop-ssd", SSD.random(d, p, N=state, heads=1, step_range=steps, seed=seed + 6)),
        (f"SSD ({heads} heads)", "prop-ssd", SSD.random(d, p, N=state, heads=heads, step_range=steps,
                                                        seed=seed + 7)),
        ("softmax attention (1 head)", "prop-softmax-attention", SoftmaxAttention.random(d, p, 1, seed=seed + 8)),
        (f"softmax attention ({heads} heads, non-causal)", "prop-softmax-attention",
         SoftmaxAttention.random(d, p, heads, causal=False, seed=seed + 9)),
        (f"linear attention ({heads} heads)", "prop-linear-attention",
         LinearAttention.random(d, p, heads, seed=seed + 10)),
        ("KAN layer", "prop-kan", KANLayer.random(d, p, seed=seed + 11)),
    ]
