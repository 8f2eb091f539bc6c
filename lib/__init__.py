"""Numerics of the book: interaction operators, models, spans, heads, gradients.

Conventions (see `lib.base`): X has shape (n, d) or (b, n, d); outputs (n, p) or
(b, n, p); operators W have shape (n, n, p, d) or (b, n, n, p, d) with
W[i, j] = 𝒲_ij (0-based positions).  numpy in → numpy out, torch in → torch out;
float64 unless a model is built with dtype=torch.float32.
"""

from .attention import LinearAttention, SoftmaxAttention
from .base import SequenceMap
from .checks import identity_error, relative_error
from .factorized import RelativeHeads, factorized_operator
from .layers import CausalConv1d, Dense, FeedForward, KANLayer
from .operators import apply_operator, is_causal, operator_norms, toeplitz_operator
from .recurrent import ElmanRNN
from .spans import OperatorSpan, interaction_rank, interaction_span, operator_span
from .ssm import SSD, LinearSSM, SelectiveSSM
from .zoo import Architecture, architecture_zoo

__all__ = [
    # the unified form
    "SequenceMap",
    "apply_operator",
    "operator_norms",
    "is_causal",
    "toeplitz_operator",
    "factorized_operator",
    # models
    "Dense",
    "FeedForward",
    "CausalConv1d",
    "KANLayer",
    "ElmanRNN",
    "LinearSSM",
    "SelectiveSSM",
    "SSD",
    "SoftmaxAttention",
    "LinearAttention",
    "RelativeHeads",
    # spans
    "OperatorSpan",
    "operator_span",
    "interaction_span",
    "interaction_rank",
    # checks
    "relative_error",
    "identity_error",
    # the framework chapter's architectures
    "Architecture",
    "architecture_zoo",
]
