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
from .spans import (OperatorSpan, PointwiseMultiple, interaction_rank, interaction_span, operator_span,
                    pointwise_multiple, pointwise_witness, sine_to_line)
from .ssm import SSD, LinearSSM, SelectiveSSM
from .zoo import Architecture, architecture_zoo
from .heads import (TokenDependentHeads, heads_from_ssm, heads_needed, lag_matrix, lag_span_bound, min_heads,
                    minimal_polynomial_degree, optimal_head_errors, population_error, s4d_ssm,
                    truncated_heads)
from .heads import (HeadFit, MapHeadBounds, SampledErrors, SingleHeadFit, cayley_dickson_values, complex_values,
                    composition_defect, continuous_head_errors, fit_heads, lag_energy_count, map_head_bounds,
                    modal_lag_span_dimension, nonsingular_dimension_bounds, nonsingular_values, pointwise_lag_rank,
                    polynomial_values, s4d_continuous, s4d_step, sampled_head_errors, singular_token,
                    token_dependent_single_head, token_matrix, SingleTokenWitness,
                    single_head_witness, token_miss, worst_conditioned_tokens)
from .training import FactorizedStudent, SoftmaxStudent, TrainResult, held_out_error, train, train_factorized
from .gradients import (DecayBound, DecayFit, SelectivePath, fit_decay_rate, gate_closing_input, gradient_reach,
                        jacobian_blocks, jacobian_norms, lag_norms, one_hop, planted_key_input, rnn_jacobian,
                        saturating_input, saturation_subset, selective_jacobian, ssm_decay_bound, stack_decay_bound,
                        with_constant_step)
from .stacks import Stack, ssm_layer

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
    "sine_to_line",
    "PointwiseMultiple",
    "pointwise_multiple",
    "pointwise_witness",
    # checks
    "relative_error",
    "identity_error",
    # the framework chapter's architectures
    "Architecture",
    "architecture_zoo",
    # heads (rank gap, head count)
    "lag_matrix",
    "min_heads",
    "minimal_polynomial_degree",
    "lag_span_bound",
    "heads_from_ssm",
    "optimal_head_errors",
    "truncated_heads",
    "heads_needed",
    "population_error",
    "TokenDependentHeads",
    "s4d_ssm",
    "s4d_continuous",
    "s4d_step",
    # heads: optimiser and sampling routes, the head count's dependence on the spectrum
    "HeadFit",
    "fit_heads",
    "SampledErrors",
    "sampled_head_errors",
    "lag_energy_count",
    "modal_lag_span_dimension",
    "continuous_head_errors",
    # heads: token-dependent coefficients (single head on generic inputs, the map-level count)
    "SingleHeadFit",
    "token_dependent_single_head",
    "SingleTokenWitness",
    "single_head_witness",
    "polynomial_values",
    "complex_values",
    "cayley_dickson_values",
    "nonsingular_values",
    "nonsingular_dimension_bounds",
    "composition_defect",
    "token_matrix",
    "worst_conditioned_tokens",
    "pointwise_lag_rank",
    "MapHeadBounds",
    "map_head_bounds",
    "singular_token",
    "token_miss",
    # training students
    "FactorizedStudent",
    "SoftmaxStudent",
    "TrainResult",
    "train",
    "train_factorized",
    "held_out_error",
    # gradients (gradient highway)
    "jacobian_norms",
    "jacobian_blocks",
    "lag_norms",
    "DecayBound",
    "ssm_decay_bound",
    "stack_decay_bound",
    "DecayFit",
    "fit_decay_rate",
    "planted_key_input",
    "one_hop",
    "with_constant_step",
    "gradient_reach",
    "gate_closing_input",
    "SelectivePath",
    "selective_jacobian",
    "saturation_subset",
    "saturating_input",
    "rnn_jacobian",
    "Stack",
    "ssm_layer",
]
