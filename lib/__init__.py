"""The numerics of the book: models as interaction operators, spans, head counts, Jacobians, training.

Models are torch modules: X (n, d) or (b, n, d) → Y (n, p) or (b, n, p), and
`model.operator(X)` → 𝒲(X) (n, n, p, d) or (b, n, n, p, d), W[..., i, j, :, :] = 𝒲_ij
(0-based positions); tensors in, tensors out, in the parameters' dtype (float64 by default).
Analysis functions (spans, head counts, Jacobian profiles, errors) take numpy or torch and
return numpy. `API` is the one list of public names: `__all__` and the API reference page
(chapters/appendix/api.md) come from it. Each chapter's experiments live in `experiments/`.
"""

from .attention import LinearAttention, MultiheadAttention, RelativeHeads, SoftmaxAttention
from .base import SequenceMap, batched
from .blocks import Mamba2Block, MambaBlock
from .heads import (fit_heads, fit_rank_limited_heads, heads_from_ssm, heads_needed, min_heads, optimal_head_errors,
                    population_error, rank_limited_error_floor, rank_limited_heads, rank_limited_values,
                    truncated_heads)
from .jacobians import jacobian_blocks, jacobian_norms
from .layers import CausalConv1d, Dense, FeedForward, KANLayer
from .operators import apply_operator, factorized_operator, identity_error, relative_error, toeplitz_operator
from .recurrent import ElmanRNN
from .spans import channel_span, interaction_rank, interaction_span, operator_span
from .ssm import SSD, DiagonalSSM, LinearSSM, SelectiveSSM, SharedStateSSM, s4d_continuous, s4d_ssm, s4d_step
from .stacks import Stack
from .training import fit, imitate
from .zoo import architecture_zoo

API = {
    "The unified form": [
        "SequenceMap", "batched", "apply_operator", "identity_error", "relative_error", "toeplitz_operator",
        "factorized_operator"],
    "Models": [
        "Dense", "FeedForward", "CausalConv1d", "KANLayer", "ElmanRNN", "LinearSSM", "SelectiveSSM", "SSD",
        "DiagonalSSM", "SharedStateSSM", "s4d_ssm", "s4d_continuous", "s4d_step", "SoftmaxAttention",
        "LinearAttention", "RelativeHeads", "Stack", "architecture_zoo"],
    "Blocks as built": ["MambaBlock", "Mamba2Block", "MultiheadAttention"],
    "Operator spans": ["operator_span", "interaction_span", "interaction_rank", "channel_span"],
    "Head counts": [
        "min_heads", "heads_from_ssm", "optimal_head_errors", "truncated_heads", "heads_needed",
        "population_error", "fit_heads", "rank_limited_heads", "rank_limited_values", "rank_limited_error_floor",
        "fit_rank_limited_heads"],
    "Jacobian profiles": ["jacobian_blocks", "jacobian_norms"],
    "Training": ["fit", "imitate"],
}

__all__ = [name for names in API.values() for name in names]
