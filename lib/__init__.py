"""Numerics of the book: interaction operators, models, spans, heads, gradients, training.

X has shape (n, d) or (b, n, d); outputs (n, p) or (b, n, p); operators W have shape
(n, n, p, d) or (b, n, n, p, d) with W[i, j] = 𝒲_ij (0-based positions). numpy in → numpy
out, torch in → torch out; float64 unless a model is built with dtype=torch.float32.

`API` below is the one list of public names: `__all__` and the API reference page
(chapters/appendix/api.md, one section per key) are generated from it.
"""

from .attention import LinearAttention, SoftmaxAttention
from .base import SequenceMap
from .factorized import RelativeHeads, factorized_operator
from .gradients import (DecayBound, DecayFit, DecayReport, FrozenGateSearch, GateClosingCheck, KeyPrice, SelectivePath,
                        decay_report, fit_decay_rate, frozen_gate_response, frozen_gate_search, gate_closing_check,
                        gate_closing_input, gate_closing_profile, gradient_reach, jacobian_blocks, jacobian_norms,
                        key_price, lag_norms, planted_key_input, planted_key_profile, random_profiles, rnn_jacobian,
                        saturating_input, saturation_subset, selective_jacobian, ssm_decay_bound, stack_decay_bound,
                        with_constant_step)
from .heads import (HeadFit, MapHeadBounds, SampledErrors, SingleHeadFit, SingleTokenWitness, TokenDependentHeads,
                    cayley_dickson_values, complex_values, composition_defect, continuous_head_errors, fit_heads,
                    heads_from_ssm, heads_needed, lag_energy_count, lag_matrix, lag_span_bound, map_head_bounds,
                    min_heads, minimal_polynomial_degree, modal_lag_span_dimension, nonsingular_dimension_bounds,
                    nonsingular_values, optimal_head_errors, pointwise_lag_rank, polynomial_values, population_error,
                    s4d_continuous, s4d_ssm, s4d_step, sampled_head_errors, single_head_witness, singular_token,
                    token_dependent_single_head, token_matrix, token_miss, truncated_heads, worst_conditioned_tokens)
from .layers import CausalConv1d, Dense, FeedForward, KANLayer
from .operators import apply_operator, identity_error, is_causal, operator_norms, relative_error, toeplitz_operator
from .recall import (RecallResult, RecallSignal, RecallTask, initial_gradient_norm, recall_model, recall_sweep,
                     signal_sweep, stable_ssm, train_recall)
from .recurrent import ElmanRNN
from .spans import (OperatorSpan, PointwiseMultiple, interaction_rank, interaction_span, operator_span,
                    pointwise_multiple, pointwise_witness, sine_to_line, span_distances)
from .ssm import SSD, LinearSSM, SelectiveSSM
from .stacks import Stack, ssm_layer
from .training import (FactorizedStudent, SoftmaxStudent, TrainResult, fit, held_out_error, train, train_factorized,
                       train_students)
from .zoo import Architecture, architecture_zoo
from .ssm import DiagonalSSM, SharedStateSSM
from .digits import (CentredHeads, DigitSequences, InputMoments, LagSpanDimension, SequenceClassifier,
                     accuracy, accuracy_knee, as_float64, classifier, exact_lag_span_dimension,
                     generic_lag_span_dimension, input_moments, load_digit_sequences, logistic_baseline, logits,
                     mean_path, train_classifier, truncation_errors, truncation_sweep, truncations,
                     wilson_interval, accuracy_report, lag_span_report, head_counts, truncation_error_samples)

API = {
    "The unified form": [
        "SequenceMap", "apply_operator", "identity_error", "relative_error", "operator_norms", "is_causal",
        "toeplitz_operator", "factorized_operator"],
    "Models": [
        "Dense", "FeedForward", "CausalConv1d", "KANLayer", "ElmanRNN", "LinearSSM", "SelectiveSSM", "SSD",
        "SoftmaxAttention", "LinearAttention", "RelativeHeads", "Stack", "ssm_layer", "Architecture",
        "architecture_zoo"],
    "Operator spans": [
        "OperatorSpan", "operator_span", "interaction_span", "interaction_rank", "sine_to_line",
        "PointwiseMultiple", "pointwise_multiple", "pointwise_witness"],
    "Head counts": [
        "lag_matrix", "min_heads", "minimal_polynomial_degree", "lag_span_bound", "modal_lag_span_dimension",
        "heads_from_ssm", "optimal_head_errors", "truncated_heads", "heads_needed", "population_error",
        "HeadFit", "fit_heads", "SampledErrors", "sampled_head_errors", "lag_energy_count",
        "continuous_head_errors", "s4d_ssm", "s4d_continuous", "s4d_step"],
    "Token-dependent heads": [
        "TokenDependentHeads", "SingleHeadFit", "token_dependent_single_head", "SingleTokenWitness",
        "single_head_witness", "span_distances", "polynomial_values", "complex_values", "cayley_dickson_values",
        "nonsingular_values", "nonsingular_dimension_bounds", "composition_defect", "token_matrix",
        "worst_conditioned_tokens", "pointwise_lag_rank", "MapHeadBounds", "map_head_bounds", "singular_token",
        "token_miss"],
    "Training": [
        "fit", "train", "train_factorized", "FactorizedStudent", "SoftmaxStudent", "TrainResult",
        "held_out_error", "train_students"],
    "Gradients": [
        "jacobian_norms", "jacobian_blocks", "lag_norms", "DecayBound", "ssm_decay_bound", "stack_decay_bound",
        "DecayFit", "fit_decay_rate", "DecayReport", "decay_report", "gradient_reach", "random_profiles",
        "planted_key_input", "planted_key_profile", "KeyPrice", "key_price", "gate_closing_input",
        "gate_closing_profile", "GateClosingCheck", "gate_closing_check", "SelectivePath", "selective_jacobian",
        "with_constant_step", "frozen_gate_response", "FrozenGateSearch", "frozen_gate_search",
        "saturation_subset", "saturating_input", "rnn_jacobian"],
    "The recall task": [
        "RecallTask", "recall_model", "stable_ssm", "train_recall", "RecallResult", "initial_gradient_norm",
        "RecallSignal", "signal_sweep", "recall_sweep"],
    "Trained SSMs": [
        "DiagonalSSM", "SharedStateSSM", "DigitSequences", "load_digit_sequences", "logistic_baseline",
        "wilson_interval", "SequenceClassifier", "classifier", "train_classifier", "logits", "accuracy",
        "as_float64", "LagSpanDimension", "generic_lag_span_dimension", "exact_lag_span_dimension",
        "InputMoments", "input_moments", "CentredHeads", "mean_path", "truncations", "truncation_errors",
        "truncation_sweep", "accuracy_knee", "accuracy_report", "lag_span_report", "head_counts",
        "truncation_error_samples"],
}

__all__ = [name for names in API.values() for name in names]
