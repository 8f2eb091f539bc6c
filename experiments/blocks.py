"""The blocks chapter's set-ups: realistic layer shapes and inputs, the head count at X and its
ε-spectrum, the Mamba-2 ablations, and the recipe that reads a `transformers` checkpoint.

Inputs X are (b, n, d_model) float64 torch tensors. A checkpoint is read only when the reader
asks for one (network); the build uses randomly initialised models of the same shapes.
"""

from __future__ import annotations

from typing import Any

import math

import numpy as np
import torch

from lib import Mamba2Block, MambaBlock
from lib._validation import check_int, check_real
from lib.heads import _tails
from lib.spans import _coefficient_span, rank

# Layer shapes of the smallest published checkpoints (their config.json files):
# state-spaces/mamba-130m-hf and state-spaces/mamba2-130m.
MAMBA_130M = dict(d_model=768, d_state=16, d_conv=4, expand=2, dt_rank=48)
MAMBA2_130M = dict(d_model=768, d_state=128, d_conv=4, expand=2, headdim=64, ngroups=1)

# The checkpoint recipe: the activation names that are SiLU in transformers (ACT2FN), and how far
# block(X) may be from the float32 mixer's output, relatively (block_and_inputs).
_SILU = ("silu", "swish")
MIXER_RTOL = 1e-4


def token_inputs(n: int, d_model: int, batch: int = 1, *, vocab: int = 1000, zipf: float = 1.1,
                 seed: Any = 0) -> torch.Tensor:
    """Text-like layer inputs X (batch, n, d_model): tokens drawn from a Zipf law over `vocab`
    fixed random embeddings (N(0, 0.02²) entries, Mamba's embedding init), then the block's
    pre-norm (RMSNorm, unit weight, eps 1e-5): each x_i has root-mean-square just below 1 (the eps
    is ~2.5 % of an entry's 0.02²). Repeated tokens repeat their vector, as in text."""
    rng = np.random.default_rng(seed)
    table = rng.normal(0.0, 0.02, size=(vocab, d_model))
    weights = 1.0 / np.arange(1, vocab + 1) ** zipf
    ids = rng.choice(vocab, size=(batch, n), p=weights / weights.sum())
    X = table[ids]
    return torch.from_numpy(X / np.sqrt((X ** 2).mean(-1, keepdims=True) + 1e-5))


def heads_at(singular_values: np.ndarray, eps: float) -> int:
    """H_ε: the least H whose best H heads leave a relative squared error <= eps,
    Σ_{q>H} σ_q² <= eps Σ_q σ_q² ({prf:ref}`prop-channel-span`, part 3)."""
    sigma, eps = _singular_values(singular_values, "singular_values"), check_real(eps, "eps", 0, 1)
    errors = _tails(sigma ** 2, len(sigma))
    return int(np.argmax(errors <= eps * errors[0]))


def _singular_values(values: Any, name: str) -> np.ndarray:
    # A 1-d, finite, non-negative, non-increasing array: the tails below assume the order.
    sigma = np.asarray(values, dtype=float)
    if sigma.ndim != 1 or not np.all(np.isfinite(sigma)) or np.any(sigma < 0) or np.any(np.diff(sigma) > 0):
        raise ValueError(f"{name} must be a 1-d array of finite, non-negative, non-increasing values")
    return sigma


def perturbed_heads_bracket(part_sigma: np.ndarray, rest_energy: float, total_energy: float,
                            eps: float, max_heads: int) -> tuple[int, int]:
    """Bounds on H_ε of W = A + E from A's singular values (A = the rows of one part, e.g. the skip's,
    over the same pairs), ‖E‖_F² = rest_energy and ‖W‖_F² = total_energy: with t_A(H) = Σ_{q>H} σ_q(A)²
    and e = ‖E‖_F, the best rank-H error of W is within e of √t_A(H) (triangle inequality, Eckart–Young),
    so H_ε(W) lies in [min{H: √t_A(H) − e <= √(ε‖W‖²)}, min{H: √t_A(H) + e <= √(ε‖W‖²)}]. Where no H
    meets the upper condition (e above the tolerance) the upper edge is `max_heads`, a bound on rank W
    the caller knows (the channels D, or the pairs)."""
    sigma, eps = _singular_values(part_sigma, "part_sigma"), check_real(eps, "eps", 0, 1)
    rest_energy, total_energy = check_real(rest_energy, "rest_energy", 0), check_real(total_energy, "total_energy", 0)
    max_heads = check_int(max_heads, "max_heads", minimum=0)
    if not total_energy > 0:
        return 0, 0                                                 # W = 0 needs no head
    tails = np.sqrt(_tails(sigma ** 2, len(sigma)))
    e, limit = math.sqrt(rest_energy), math.sqrt(eps * total_energy)
    lower = int(np.argmax(tails - e <= limit))
    upper = int(np.argmax(tails + e <= limit)) if tails[-1] + e <= limit else max_heads  # no bound from A
    return lower, upper


def count_row(span: Any, pairs: int, epsilons: list[float], rtol: float = 1e-10) -> dict:
    """One row of the head-count table from a `channel_span` over `pairs` pairs (i, j): the count
    at the rank rule rtol, the smallest singular value against the largest, the rank of Γ, H_ε for
    each ε, and Ω's conditioning."""
    lam, sigma, sigma_g = span.gram_eigenvalues, span.singular_values, span.coefficient_singular_values
    return ({"channels D": len(lam), "pairs (i, j)": pairs, "heads at X": span.dim,
             "σ_min/σ₁": float(sigma[-1] / sigma[0]), "rank Γ": rank(sigma_g, rtol)}
            | {f"H at ε={eps:g}": heads_at(sigma, eps) for eps in epsilons}
            | {"λmin(Ω)/λmax(Ω)": float(lam[0] / lam[-1])})


def spans_by_lag(block: Any, X: torch.Tensor, lags: tuple[int, ...] = (0,),
                 rtol: float = 1e-10) -> tuple[dict[int, Any], dict]:
    """`channel_span(block, X, min_lag=lag)` for each lag, from one computation of the coefficients
    (at d_inner 1536 they cost seconds), and the skip's part of them. X: (n, d).

    The skip enters g only through the convolution: its term is g^D_ij = s_i ⊙ w_{i−j} ⊙ σ(c_i) ⊙ D
    for i − j < K (the block's own output scale s and pre-activation c; D per channel), the rest of g
    being the scan's. Returns (spans, skip): skip["span"] is the span of the g^D_ij over all pairs
    j <= i, and skip["skip share"], skip["scan share"] the shares of the operator's energy
    Σ_{j<=i} ‖𝒲_ij‖²_F (‖U diag(g) V‖²_F = gᵀΩg) in g^D alone and in g − g^D alone."""
    with torch.no_grad():
        P, s, c = block._pieces(X[None].to(torch.float64))
        g = block._combine(P, s)[0]
        U, V = (t.to(torch.float64) for t in block.factors())
        n, K, w = X.shape[0], block.d_conv, block.taps().to(torch.float64)
        D = block.D if block.D.shape[0] == block.d_inner else block.D.repeat_interleave(block.headdim)
        g_skip = torch.zeros_like(g)
        for k in range(min(K, n)):  # pairs (i, i − k)
            i = torch.arange(k, n)
            g_skip[i, i - k] = s[0, i] * w[k] * torch.sigmoid(c[0, i]) * D
        spans = {}
        for lag in lags:
            rows, cols = torch.tril_indices(n, n, offset=-lag)
            spans[lag] = _coefficient_span(g[rows, cols], U, V, rtol)
        rows, cols = torch.tril_indices(n, n)
        omega = (U.T @ U) * (V @ V.T)
        energy = lambda h: float(torch.einsum("pq,qr,pr->", h[rows, cols], omega, h[rows, cols]))
        total = energy(g)
        skip = {"span": _coefficient_span(g_skip[rows, cols], U, V, rtol),
                "skip share": energy(g_skip) / total, "scan share": energy(g - g_skip) / total}
    return spans, skip


def without_skip(block: Any) -> Any:
    """A copy of a block with its skip D_skip (Mamba) or D_h (Mamba-2) set to zero."""
    import copy

    copied = copy.deepcopy(block)
    with torch.no_grad():
        copied.D.zero_()
    return copied


def factored_identity_error(block: Any, X: torch.Tensor) -> float:
    """Relative error of Σ_j U diag(g_ij) V x_j + β_i against block(X), X (n, d), without forming
    the n² blocks of size d × d (the identity of {prf:ref}`prop-mamba-block` at any width)."""
    with torch.no_grad():
        U, V = block.factors()
        y = torch.einsum("ijq,jq->iq", block.coefficients(X), X @ V.T) @ U.T + block.offset(X)
        reference = block(X)
        return float(torch.linalg.vector_norm(y - reference) / torch.linalg.vector_norm(reference))


def _transformers():
    # Imported on use (the build reads no checkpoint); quiet: no tqdm notice, no notice that the
    # CUDA kernels are missing (the torch paths are the reference the book checks against).
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import transformers
    transformers.logging.set_verbosity_error()
    return transformers


def random_mamba_lm(layers: int, seed: Any = 0):
    """A randomly initialised `transformers` MambaForCausalLM with state-spaces/mamba-130m-hf's
    configuration (vocabulary 50280, d = 768, N = 16, step rank 48), cut to `layers` layers:
    what the build runs the checkpoint recipe on (no network)."""
    transformers = _transformers()
    torch.manual_seed(seed)
    config = transformers.MambaConfig(vocab_size=50280, hidden_size=768, state_size=16, expand=2, conv_kernel=4,
                         time_step_rank=48, num_hidden_layers=layers)
    return transformers.MambaForCausalLM(config).eval()


def _check_modelled(mixer: torch.nn.Module) -> None:
    """Raise ValueError naming a configuration field of the mixer that lib's blocks do not model."""
    kind = type(mixer).__name__[:-len("Mixer")]
    if mixer.activation not in _SILU:
        raise ValueError(f"the checkpoint's hidden_act is {mixer.activation!r}; lib's {kind}Block applies "
                         f"SiLU (hidden_act 'silu') and models no other activation")
    if kind == "Mamba2" and tuple(float(t) for t in mixer.time_step_limit) != (0.0, float("inf")):
        raise ValueError(f"the checkpoint's time_step_limit is {tuple(mixer.time_step_limit)}; lib's Mamba2Block "
                         f"does not model Mamba-2's clamp of the step Δ (only the no-op default (0.0, inf))")


def block_from_mixer(mixer: torch.nn.Module, dtype: torch.dtype = torch.float64) -> Any:
    """A lib block with the weights of a `transformers` MambaMixer or Mamba2Mixer, loaded strictly
    (a key or shape that does not match raises, naming it). Configuration the lib blocks do not
    model is rejected first, naming the field: `hidden_act` other than SiLU (Mamba's conv output
    and gate, Mamba-2's conv output) and, for Mamba-2, a `time_step_limit` other than the no-op
    (0, ∞). What no field names is caught by `block_and_inputs`, which compares outputs."""
    kind = type(mixer).__name__
    if kind not in ("MambaMixer", "Mamba2Mixer"):
        raise TypeError(f"mixer must be a transformers MambaMixer or Mamba2Mixer; got {kind}")
    _check_modelled(mixer)
    if kind == "MambaMixer":
        block = MambaBlock(mixer.hidden_size, mixer.ssm_state_size, mixer.conv_kernel_size,
                           mixer.intermediate_size // mixer.hidden_size, mixer.time_step_rank,
                           conv_bias=mixer.conv1d.bias is not None, bias=mixer.in_proj.bias is not None,
                           dtype=dtype)
    else:
        block = Mamba2Block(mixer.hidden_size, mixer.ssm_state_size, mixer.conv_kernel_size,
                            mixer.intermediate_size // mixer.hidden_size, mixer.head_dim, mixer.n_groups,
                            bias=mixer.in_proj.bias is not None, conv_bias=mixer.conv1d.bias is not None,
                            norm_eps=mixer.norm.variance_epsilon, dtype=dtype)
    state = {key: value.to(dtype) for key, value in mixer.state_dict().items()}
    block.load_state_dict(state, strict=True)
    return block


def random_ids(model: torch.nn.Module, n: int, seed: Any = 0) -> torch.Tensor:
    """n token ids (1, n) drawn uniformly from the model's vocabulary (its config.vocab_size)."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, model.config.vocab_size, size=(1, n)))


def load_checkpoint(name: str, layer: int, text_ids: Any = None, *, n: int = 64, seed: Any = 0,
                    rtol: float = MIXER_RTOL):
    """(block, X): layer `layer`'s mixer of a `transformers` Mamba or Mamba-2 checkpoint (a hub
    name such as "state-spaces/mamba-130m-hf", which needs a network, or a local directory) as a
    lib block, and the inputs its mixer sees on the token ids `text_ids` (b, n) — by default n
    ids drawn from the checkpoint's own vocabulary (`random_ids`). Raises ValueError if the block
    does not reproduce the mixer's output to `rtol` (`block_and_inputs`)."""
    model = _transformers().AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32).eval()
    ids = random_ids(model, n, seed) if text_ids is None else text_ids
    return block_and_inputs(model, layer, ids, rtol=rtol)


def block_and_inputs(model: torch.nn.Module, layer: int, text_ids: Any, *,
                     rtol: float = MIXER_RTOL) -> tuple[Any, torch.Tensor]:
    """(block, X) of a loaded `transformers` Mamba/Mamba-2 causal LM: its layer's mixer as a lib
    block (`block_from_mixer`), and what that mixer receives (after the layer's pre-norm) on
    `text_ids`, captured by a forward pre-hook (so the recipe does not depend on how hidden states
    are reported). A forward hook captures the mixer's output Y too: if ‖block(X) − Y‖/‖Y‖ exceeds
    `rtol` the block is not the checkpoint's map (something it uses that lib does not model) and
    a ValueError names the layer and the difference. Y comes from the float32 model: about 1e-6
    on random layers of the 130m shapes (n = 64 to 300), so the default 1e-4 leaves a factor 100."""
    layers = model.backbone.layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(layers):
        raise ValueError(f"layer must be an integer in [0, {len(layers)}); got {layer!r}")
    rtol = check_real(rtol, "rtol", 0.0, open_interval=True)
    mixer, seen, out = layers[layer].mixer, [], []
    block = block_from_mixer(mixer)  # before the forward: configuration it does not model raises here
    hooks = [mixer.register_forward_pre_hook(
                 lambda module, args, kwargs: seen.append(args[0] if args else kwargs["hidden_states"]),
                 with_kwargs=True),
             mixer.register_forward_hook(
                 lambda module, args, output: out.append(output[0] if isinstance(output, tuple) else output))]
    try:
        with torch.no_grad():
            model(torch.as_tensor(text_ids))
    finally:
        for hook in hooks:
            hook.remove()
    X = seen[0].detach().to(torch.float64)
    with torch.no_grad():
        Y = out[0].detach().to(torch.float64)
        difference = float(torch.linalg.vector_norm(block(X) - Y) / torch.linalg.vector_norm(Y))
    if not difference <= rtol:  # NaN fails too
        raise ValueError(f"layer {layer}: lib's {type(block).__name__} differs from the checkpoint's mixer by "
                         f"{difference:.1e} relative on the captured inputs (rtol {rtol:g}): the checkpoint uses "
                         f"something the block does not model")
    return block, X


def coefficient_spectrum(g: torch.Tensor) -> np.ndarray:
    """Singular values of Γ, the rows g_ij (j <= i) of one input's coefficients g (n, n, D)."""
    rows, cols = torch.tril_indices(g.shape[0], g.shape[0])
    gamma = g[rows, cols].to(torch.float64)
    if gamma.shape[0] > gamma.shape[1]:  # keeps the singular values; numpy's SVD is the faster
        gamma = torch.linalg.qr(gamma, mode="r").R
    return np.linalg.svd(gamma.numpy(), compute_uv=False)


def token_caps(X: Any, heads: int, window: int) -> tuple[int, int]:
    """Part 5 of {prf:ref}`prop-mamba2-count`: with R_t the number of pairs (i, j), j <= i, whose output
    position holds token t (R_t = Σ_{i: x_i = t} i, positions 1-based), the caps Σ_t min(R_t, H) on
    rank Γ with the gate alone and Σ_t min(R_t, K H) with the gate and the convolution, over the
    distinct tokens t of X (n, d). H = `heads`, K = `window`."""
    X = np.asarray(X.detach() if hasattr(X, "detach") else X, dtype=float)
    if X.ndim != 2:
        raise ValueError(f"X must have shape (n, d); got {X.shape}")
    heads, window = check_int(heads, "heads"), check_int(window, "window")
    _, token = np.unique(X, axis=0, return_inverse=True)
    R = np.bincount(token.ravel(), weights=np.arange(1, len(X) + 1))  # pairs ending at each token
    return int(np.minimum(R, heads).sum()), int(np.minimum(R, window * heads).sum())


def mamba2_factors(block: Any, X: torch.Tensor) -> dict[str, np.ndarray]:
    """Singular values of Γ for Mamba-2's coefficients g_ij = s_i ⊙ Σ_k w_k ⊙ ψ_{i,j+k} ⊙ σ(c_{j+k})
    ({prf:ref}`prop-mamba2-count`) with per-channel factors removed or kept: "SSD core" (ψ_ij alone,
    constant on each head's channels), each factor alone ("gate" s_i ⊙ ψ_ij, "conv"
    Σ_k w_k ⊙ ψ_{i,j+k}, "slope" ψ_ij ⊙ σ(c_j)), each pair, and "block" (all three).
    X: one input (n, d). The ablated matrices are not blocks anyone builds: they say which
    factors lift the count."""
    with torch.no_grad():
        P, s, c = block._pieces(X[None])                   # P[:, i, m] = ψ_im ⊙ σ(c_m)
        slope = torch.sigmoid(c)[:, None]                  # σ(c_m), by column m
        psi, gate, one = P / slope, s[:, :, None], torch.ones_like(s)
        conv = lambda Q, scale=one: block._combine(Q, scale)[0]  # scale_i ⊙ Σ_k w_k ⊙ Q[i, j + k]
        variants = {"SSD core": psi[0], "gate": (gate * psi)[0], "conv": conv(psi), "slope": (psi * slope)[0],
                    "gate + conv": conv(psi, s), "gate + slope": (gate * psi * slope)[0],
                    "conv + slope": conv(psi * slope), "block": conv(psi * slope, s)}
        return {name: coefficient_spectrum(g) for name, g in variants.items()}
