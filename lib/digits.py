"""Trained SSMs on real data ({ref}`chap-trained-heads`): digits read pixel by pixel, classifiers
built from lib's layers, and what their trained layers are as head models.

The data are scikit-learn's bundled 8 × 8 digits (1,797 images, nothing downloaded), scaled to
[0, 1] and read row by row: sequences of n = 64 tokens of width 1.  A classifier is an encoder
(1 → d), residual blocks h ← h + W GELU(layer(LayerNorm h)) around a mixing layer
(`DiagonalSSM`, `SharedStateSSM`, `SoftmaxAttention`, or a truncation), mean pooling over
positions and a decoder (d → 10).  The analysis replaces a trained LTI layer by its optimal
H-head truncation under the moments of the layer's own inputs ({prf:ref}`prop-covariance-head-count`),
with the exact mean path, and measures what the classifier loses.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ._convolution import fft_causal_conv
from ._validation import as_real_tensor, check_choice, check_int, check_real, resolve_dtype
from .attention import SoftmaxAttention
from .base import SequenceMap
from .factorized import RelativeHeads
from .heads import _check_lti, _covariance_root, _lag_span, _relative_heads, optimal_head_errors, population_error
from .spans import _rank
from .ssm import DiagonalSSM, SharedStateSSM
from .training import fit

KINDS = ("s4d-lin", "s4d-real", "s5", "attention")


# -- data --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DigitSequences:
    """Images as sequences: X_train (b, 64, 1), X_test (b', 64, 1), float64 in [0, 1];
    y_train (b,), y_test (b',), int64 labels 0..9."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


def load_digit_sequences(test_size: float = 0.25, seed: int = 0) -> DigitSequences:
    """`sklearn.datasets.load_digits` / 16, pixels row by row, split by a stratified
    `train_test_split(test_size=test_size, random_state=seed)`, 0 < test_size < 1."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    test_size = check_real(test_size, "test_size", positive=True, below=1.0)
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, test_size=test_size, stratify=y,
                                                        random_state=check_int(seed, "seed", minimum=0))
    return DigitSequences(X_train[..., None], y_train.astype(np.int64), X_test[..., None], y_test.astype(np.int64))


def logistic_baseline(data: DigitSequences) -> float:
    """Test accuracy of multinomial logistic regression on the 64 raw pixels (lbfgs, C = 1)."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=5000).fit(data.X_train[..., 0], data.y_train)
    return float(model.score(data.X_test[..., 0], data.y_test))


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion successes / trials (z = 1.96: 95 %)."""
    trials = check_int(trials, "trials")
    successes = check_int(successes, "successes", minimum=0)
    if successes > trials:
        raise ValueError(f"successes must be <= trials = {trials}; got {successes}")
    z = check_real(z, "z", positive=True)
    p, z2 = successes / trials, z * z / trials
    centre, half = (p + z2 / 2) / (1 + z2), z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials)) / (1 + z2)
    return centre - half, centre + half


# -- classifiers -------------------------------------------------------------------------------


class SequenceClassifier(torch.nn.Module):
    """logits = decoder(mean_i h_i), h ← h + W_m GELU(layer_m(LayerNorm_m h)) for m = 1..M, h = encoder(x) (+ P).

    Args:
        layers: the mixing layers: torch modules with `_forward(X)` for X (b, n, d), d = p equal
            for all (lib SequenceMaps, or `CentredHeads`); their dtype is the classifier's.
        in_width: token width of the data.  classes: number of classes.
        positions: if an int n_max, a learned table P (n_max, d), N(0, 0.02²) at first, is added
            to the encoded tokens (absolute positions, as in GPT and ViT); None for none.
        seed: seed of the torch initialisation of encoder, norms, mixers, decoder and P.
    """

    def __init__(self, layers: Sequence[torch.nn.Module], *, in_width: int = 1, classes: int = 10,
                 positions: int | None = None, seed: int = 0) -> None:
        super().__init__()
        if not layers:
            raise ValueError("layers must hold at least one mixing layer")
        d, dtype = layers[0].d, layers[0].dtype
        for layer in layers:
            if not callable(getattr(layer, "_forward", None)) or (layer.d, layer.p) != (d, d):
                raise ValueError(f"layers must be maps of width d = p = {d} with a _forward method; "
                                 f"got {type(layer).__name__}")
        self.d = d
        with torch.random.fork_rng():
            torch.manual_seed(check_int(seed, "seed", minimum=0))
            self.encoder = torch.nn.Linear(check_int(in_width, "in_width"), d, dtype=dtype)
            self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d, dtype=dtype) for _ in layers)
            self.mixers = torch.nn.ModuleList(torch.nn.Linear(d, d, dtype=dtype) for _ in layers)
            self.decoder = torch.nn.Linear(d, check_int(classes, "classes"), dtype=dtype)
            table = None if positions is None else 0.02 * torch.randn(check_int(positions, "positions"), d)
        self.positions = None if table is None else torch.nn.Parameter(table.to(dtype))
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Logits (b, classes) of X (b, n, in_width), a torch tensor of the classifier's dtype."""
        h = self._encode(X)
        for m in range(len(self.layers)):
            h = self._block(m, h)
        return self.decoder(h.mean(1))

    def _encode(self, X: torch.Tensor) -> torch.Tensor:
        h = self.encoder(X)
        return h if self.positions is None else h + self.positions[: X.shape[1]]

    def _block(self, m: int, h: torch.Tensor, layer: torch.nn.Module | None = None) -> torch.Tensor:
        layer = self.layers[m] if layer is None else layer
        return h + self.mixers[m](F.gelu(layer._forward(self.norms[m](h))))

    def layer_inputs(self, X: Any) -> list[np.ndarray]:
        """The input of every mixing layer (after its LayerNorm) on X (b, n, in_width): (b, n, d) each, float64."""
        h, inputs = self._encode(_as_batch(X, self, "X")), []
        with torch.no_grad():
            for m in range(len(self.layers)):
                inputs.append(self.norms[m](h).double().numpy())
                h = self._block(m, h)
        return inputs


def _as_batch(X: Any, model: SequenceClassifier, name: str) -> torch.Tensor:
    tensor, _ = as_real_tensor(X, name)
    width = model.encoder.in_features
    if tensor.ndim != 3 or min(tensor.shape) < 1 or tensor.shape[-1] != width:
        raise ValueError(f"{name} must have shape (b, n, {width}) with b, n >= 1; got {tuple(tensor.shape)}")
    if model.positions is not None and tensor.shape[1] > len(model.positions):
        raise ValueError(f"{name} must have length n <= {len(model.positions)}; got n = {tensor.shape[1]}")
    return tensor.detach().to(model.encoder.weight.dtype)


def classifier(kind: str, d: int, *, state: int = 32, heads: int = 1, n: int = 64, blocks: int = 2,
               step_range: tuple[float, float] = (1e-3, 1e-1), seed: int = 0,
               dtype: Any = torch.float32) -> SequenceClassifier:
    """A `SequenceClassifier` with `blocks` mixing layers of width d (layer m seeded seed + m).

    "s4d-lin", "s4d-real": `DiagonalSSM.random(d, state, init="lin" | "real")` (S4D);
    "s5": `SharedStateSSM.random(d, state)` (P = state); "attention": causal `SoftmaxAttention`
    with `heads` heads (d_k = d_v = d / heads; W_Q, W_K, W_V, W_O ~ N(0, 1/d)), learned
    relative-position biases (zero at first) and a learned absolute position table, for n ≤ n.
    """
    kind = check_choice(kind, "kind", KINDS)
    d, blocks, seed = check_int(d, "d"), check_int(blocks, "blocks"), check_int(seed, "seed", minimum=0)
    dtype = resolve_dtype(dtype)
    layers = []
    for m in range(blocks):
        if kind == "s5":
            layers.append(SharedStateSSM.random(d, state, step_range=step_range, seed=seed + m, dtype=dtype))
        elif kind == "attention":
            layers.append(_attention(d, check_int(heads, "heads"), check_int(n, "n"), seed + m, dtype))
        else:
            layers.append(DiagonalSSM.random(d, state, init=kind[4:], step_range=step_range, seed=seed + m,
                                             dtype=dtype))
    return SequenceClassifier(layers, positions=n if kind == "attention" else None, seed=seed)


def _attention(d: int, heads: int, n: int, seed: int, dtype: torch.dtype) -> SoftmaxAttention:
    if d % heads:
        raise ValueError(f"heads must divide d = {d}; got {heads}")
    rng, width = np.random.default_rng(seed), d // heads
    W_Q, W_K, W_V = (rng.standard_normal((heads, width, d)) / math.sqrt(d) for _ in range(3))
    W_O = rng.standard_normal((heads, d, width)) / math.sqrt(d)
    return SoftmaxAttention(W_Q, W_K, W_V, W_O, causal=True, position_bias=np.zeros((heads, n)), dtype=dtype)


def train_classifier(model: SequenceClassifier, data: DigitSequences, *, epochs: int, batch: int = 64,
                     lr: float = 3e-3, final_lr: float | None = None, seed: int = 0, device: Any = "cpu",
                     progress: Callable[[str], None] | None = None, label: str = "") -> np.ndarray:
    """Train in place with `lib.fit` (Adam, cross-entropy) for `epochs` passes over the training set.

    Every epoch visits the training images once in a fresh order (torch.randperm on fit's
    seeded generator), in minibatches of `batch` (the last one smaller).  Returns the loss of
    every step, shape (epochs · ⌈b / batch⌉,).
    """
    epochs, batch = check_int(epochs, "epochs"), check_int(batch, "batch")
    if not isinstance(model, SequenceClassifier):
        raise TypeError(f"model must be a SequenceClassifier; got {type(model).__name__}")
    X = torch.tensor(data.X_train, dtype=model.encoder.weight.dtype)
    y = torch.tensor(data.y_train)

    def batches(generator: torch.Generator):
        while True:
            order = torch.randperm(len(X), generator=generator)
            for start in range(0, len(X), batch):
                yield X[order[start:start + batch]], y[order[start:start + batch]]

    return fit(model, lambda net, X_b, y_b: F.cross_entropy(net(X_b), y_b), batches,
               steps=epochs * -(-len(X) // batch), lr=lr, final_lr=final_lr, seed=seed, device=device,
               progress=progress, label=label)


def logits(model: SequenceClassifier, X: Any) -> np.ndarray:
    """The classifier's logits on X (b, n, in_width), without gradients: float64, (b, classes)."""
    with torch.no_grad():
        return model(_as_batch(X, model, "X")).double().numpy()


def accuracy(model: SequenceClassifier, X: Any, y: Any) -> float:
    """The fraction of sequences X (b, n, in_width) whose largest logit is at the label y (b,)."""
    predicted = logits(model, X).argmax(1)
    y = np.asarray(y)
    if y.shape != predicted.shape:
        raise ValueError(f"y must have shape ({len(predicted)},); got {y.shape}")
    return float((predicted == y).mean())


def as_float64(model: SequenceClassifier) -> SequenceClassifier:
    """A float64 copy of the classifier (lib layers then compute in float64)."""
    double = copy.deepcopy(model).to(torch.float64)
    for module in double.modules():
        if isinstance(module, SequenceMap):
            module.dtype = torch.float64
    return double


# -- the exact lag span dimension of a trained layer (prop-trained-lag-span) --------------------


@dataclass(frozen=True)
class LagSpanDimension:
    """`exact_lag_span_dimension`: k; route ("modes" or "extended precision"); ratios σ_k/σ_1
    (smallest kept) and σ_{k+1}/σ_1 (largest dropped, 0 if none) of the matrix whose rank is k."""

    k: int
    route: str
    smallest_kept: float
    largest_dropped: float


def generic_lag_span_dimension(layer: DiagonalSSM | SharedStateSSM, n: int) -> int:
    """The k_n of almost every parameter ({prf:ref}`prop-trained-lag-span`): min(n, d) for a
    DiagonalSSM, min(P + 1, n) for a SharedStateSSM with P <= d(d − 1) (ValueError otherwise)."""
    n = check_int(n, "n")
    if isinstance(layer, DiagonalSSM):
        return min(n, layer.d)
    if isinstance(layer, SharedStateSSM):
        if layer.P > layer.d * (layer.d - 1):
            raise ValueError(f"layer must have P <= d(d - 1) = {layer.d * (layer.d - 1)} for the proven "
                             f"generic value; got P = {layer.P}")
        return min(layer.P + 1, n)
    raise TypeError(f"layer must be a DiagonalSSM or SharedStateSSM; got {type(layer).__name__}")


def exact_lag_span_dimension(layer: DiagonalSSM | SharedStateSSM, n: int, *, digits: int = 50,
                             separation: float = 1e-8) -> LagSpanDimension:
    """k_n = dim span{L_0..L_{n−1}} of a trained layer, by a route that float64 rounding cannot blur.

    SharedStateSSM: the rank of its residues (`modes`; equal nodes merged, their residues
    summed, as λ = λ̄ for a real mode), {prf:ref}`prop-modal-lag-span` with the skip as the node
    0: needs n ≥ the number of distinct nodes, pairwise apart by more than
    separation · max(1, max|ν|) (rank rule rtol 1e-10).  DiagonalSSM: the rank of the n × d
    matrix [K[q, ℓ] + δ_ℓ0 D_q] (the diagonals of the lags) computed by mpmath with `digits`
    significant digits from the float64 parameters (exact binary numbers), counting
    σ_q > 10^{−(digits − 10)} σ_1: ten digits above the rounding of the computation.
    """
    n, digits = check_int(n, "n"), check_int(digits, "digits", minimum=20)
    separation = check_real(separation, "separation", positive=True)
    if isinstance(layer, SharedStateSSM):
        nodes, index = np.unique(layer.modes()[0], return_inverse=True)    # equal nodes share a residue
        residues = np.zeros((len(nodes), layer.d * layer.d), dtype=complex)
        np.add.at(residues, index.ravel(), layer.modes()[1].reshape(len(index.ravel()), -1))
        if n < len(nodes):
            raise ValueError(f"n must be >= {len(nodes)}, the number of distinct nodes, for the modal route; "
                             f"got n = {n}")
        gaps = np.abs(nodes[:, None] - nodes[None, :]) + np.diag(np.full(len(nodes), np.inf))
        if gaps.min() <= separation * max(1.0, np.abs(nodes).max()):
            raise ValueError(f"layer has (nearly) repeated nodes (smallest gap {gaps.min():.2e}); the modal route "
                             "needs distinct ones")
        return _ranked(np.linalg.svd(residues, compute_uv=False), 1e-10, "modes")
    if isinstance(layer, DiagonalSSM):
        return _ranked(_extended_kernel_singular_values(layer, n, digits), 10.0 ** (10 - digits),
                       "extended precision")
    raise TypeError(f"layer must be a DiagonalSSM or SharedStateSSM; got {type(layer).__name__}")


def _ranked(sigma: np.ndarray, rtol: float, route: str) -> LagSpanDimension:
    k = _rank(sigma, rtol)
    kept = float(sigma[k - 1] / sigma[0]) if k else 0.0
    dropped = float(sigma[k] / sigma[0]) if k < len(sigma) and sigma[0] > 0 else 0.0
    return LagSpanDimension(k, route, kept, dropped)


def _extended_kernel_singular_values(layer: DiagonalSSM, n: int, digits: int) -> np.ndarray:
    # Singular values of [K[q, ℓ] + δ_ℓ0 D_q] (n × d) in mpmath; the float64 parameters are exact binary numbers.
    import mpmath

    ctx = mpmath.MPContext()
    ctx.dps = digits
    par = {name: getattr(layer, f"_{name}").detach().double().numpy() for name in ("log_step", "A_log", "C", "D")}
    imag = layer._A_imag.detach().double().numpy() if layer.complex else np.zeros_like(par["A_log"])
    K = ctx.matrix(n, layer.d)
    for q in range(layer.d):
        step = ctx.exp(ctx.mpf(par["log_step"][q]))
        for m in range(layer.M):
            lam = ctx.mpc(-ctx.exp(ctx.mpf(par["A_log"][q, m])), ctx.mpf(imag[q, m]))
            c = ctx.mpc(*par["C"][q, m]) if layer.complex else ctx.mpf(par["C"][q, m])
            weight, mu = c * ctx.expm1(step * lam) / lam, ctx.exp(step * lam)
            for ell in range(n):
                K[ell, q] += 2 * ctx.re(weight) if layer.complex else ctx.re(weight)
                weight *= mu
        K[0, q] += ctx.mpf(par["D"][q])
    return np.array([float(s) for s in ctx.svd_r(K, compute_uv=False)])


# -- the moments of a layer's inputs and its truncation (prop-covariance-head-count) ------------


@dataclass(frozen=True)
class InputMoments:
    """Mean x̄ (d,) and covariance Σ (d, d) (divisor count) of tokens pooled over sequences and
    positions; count, the number of tokens."""

    mean: np.ndarray
    covariance: np.ndarray
    count: int


def input_moments(inputs: Any) -> InputMoments:
    """The moments of the tokens of inputs (b, n, d), every position of every sequence alike."""
    tensor, _ = as_real_tensor(inputs, "inputs", dtype=torch.float64)
    if tensor.ndim != 3 or min(tensor.shape) < 1:
        raise ValueError(f"inputs must have shape (b, n, d) with all sizes >= 1; got {tuple(tensor.shape)}")
    tokens = tensor.reshape(-1, tensor.shape[-1]).numpy()
    mean = tokens.mean(0)
    centred = tokens - mean
    return InputMoments(mean, centred.T @ centred / len(tokens), len(tokens))


class CentredHeads(torch.nn.Module):
    """H heads on centred tokens plus the exact mean path: ŷ_i = Σ_h Σ_{ℓ≤i} c[h, ℓ] V_h (x_{i−ℓ} − x̄) + ȳ_i.

    With ȳ_i = Σ_{ℓ≤i} L_ℓ x̄, the layer's output on the constant token x̄, the error is that of
    the heads on the centred tokens ({prf:ref}`prop-covariance-head-count`, part 2).  An affine
    map, not a factorized one unless x̄ = 0.  The forward pass convolves with
    L̂_ℓ = Σ_h c[h, ℓ] V_h by FFT (one p × d kernel whatever H); lengths up to heads.max_length.

    Args:
        heads: a RelativeHeads.  mean: x̄, shape (d,).  mean_path: ȳ, shape (n_max, p).
    """

    def __init__(self, heads: RelativeHeads, mean: Any, mean_path: Any) -> None:
        super().__init__()
        if not isinstance(heads, RelativeHeads):
            raise TypeError(f"heads must be a RelativeHeads; got {type(heads).__name__}")
        self.heads, self.d, self.p, self.H, self.dtype = heads, heads.d, heads.p, heads.H, heads.dtype
        mean, _ = as_real_tensor(mean, "mean", dtype=self.dtype)
        mean_path, _ = as_real_tensor(mean_path, "mean_path", dtype=self.dtype)
        if tuple(mean.shape) != (self.d,) or tuple(mean_path.shape) != (heads.max_length, self.p):
            raise ValueError(f"mean must have shape ({self.d},) and mean_path ({heads.max_length}, {self.p}); "
                             f"got {tuple(mean.shape)} and {tuple(mean_path.shape)}")
        self.register_buffer("mean", mean.detach().clone())
        self.register_buffer("mean_path", mean_path.detach().clone())

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        kernel = self.heads._lags(n).to(X.dtype)
        return fft_causal_conv(X - self.mean.to(X.dtype), kernel, "fpd,bfd->bfp") + self.mean_path[:n].to(X.dtype)

    def forward(self, X: Any) -> np.ndarray:
        """ŷ for X (b, n, d), n <= max_length: float64 numpy."""
        X, _ = as_real_tensor(X, "X", dtype=self.dtype)
        if X.ndim != 3 or X.shape[-1] != self.d or not 1 <= X.shape[1] <= self.heads.max_length:
            raise ValueError(f"X must have shape (b, n, {self.d}) with 1 <= n <= {self.heads.max_length}; "
                             f"got {tuple(X.shape)}")
        with torch.no_grad():
            return self._forward(X).double().numpy()


def mean_path(layer: Any, n: int, mean: Any) -> np.ndarray:
    """ȳ_i = Σ_{ℓ≤i} L_ℓ x̄ for i < n: an LTI layer's output on the constant input x̄ (d,), shape (n, p)."""
    layer, n = _check_lti(layer), check_int(n, "n")
    mean, _ = as_real_tensor(mean, "mean", dtype=torch.float64)
    if tuple(mean.shape) != (layer.d,):
        raise ValueError(f"mean must have shape ({layer.d},); got {tuple(mean.shape)}")
    return np.cumsum(layer._lags(n).detach().double().numpy() @ mean.numpy(), axis=0)


def truncations(layer: Any, n: int, heads: Sequence[int], moments: InputMoments, *,
                centre: bool = True) -> dict[int, CentredHeads]:
    """The optimal H-head truncations of an LTI layer under tokens with `moments`, for H in heads.

    `truncated_heads(layer, n, H, covariance=Σ)` for every H from one singular value
    decomposition of G_Σ ({prf:ref}`prop-covariance-head-count`), on the centred tokens with the
    exact mean path (centre=True); centre=False: the same heads on the raw tokens (x̄, ȳ = 0),
    whose error gains the mean term of the proposition.
    """
    layer, n = _check_lti(layer), check_int(n, "n")
    if not isinstance(moments, InputMoments):
        raise TypeError(f"moments must be InputMoments; got {type(moments).__name__}")
    heads = [check_int(H, "heads[...]", minimum=0) for H in heads]
    root, pinv_root = _covariance_root(moments.covariance, layer.d)
    M, span = _lag_span(layer, n, weighted=True, root=root)
    mean = moments.mean if centre else np.zeros(layer.d)
    path = mean_path(layer, n, mean)
    return {H: CentredHeads(_relative_heads(layer, M, span, min(H, span.dim), pinv_root), mean, path)
            for H in heads}


def truncation_errors(layer: Any, n: int, heads: Sequence[int], moments: InputMoments,
                      inputs: Any) -> list[dict]:
    """Predicted and measured relative squared errors of a layer's H-head truncations, one record per H.

    All relative to the centred output energy.  "predicted": Σ_{q>H} σ_q(G_Σ)² / ‖G_Σ‖²_F, the
    closed form for tokens iid over positions with the moments; "measured": Σ‖y − ŷ‖² / Σ‖y − m‖²
    on inputs (b, n, d), y the layer's output, ŷ the truncation with the mean path, m the mean
    path; "measured, no mean path": the same heads on the raw tokens; "predicted, no mean path":
    its iid value with the mean term, `population_error(..., covariance=Σ, mean=x̄)` / ‖G_Σ‖²_F.
    """
    layer, n = _check_lti(layer), check_int(n, "n")
    X, _ = as_real_tensor(inputs, "inputs", dtype=torch.float64)
    if X.ndim != 3 or tuple(X.shape[1:]) != (n, layer.d):
        raise ValueError(f"inputs must have shape (b, {n}, {layer.d}); got {tuple(X.shape)}")
    centred, plain = (truncations(layer, n, heads, moments, centre=c) for c in (True, False))
    tails = optimal_head_errors(layer, n, max(centred), covariance=moments.covariance)
    with torch.no_grad():
        Y = layer._forward(X.to(layer.dtype)).double().numpy()
    energy = float(((Y - mean_path(layer, n, moments.mean)) ** 2).sum())
    X = X.numpy()
    records = []
    for H in centred:
        exact = population_error(layer, plain[H].heads, n, covariance=moments.covariance, mean=moments.mean)
        records.append({"H": H, "predicted": float(tails[H] / tails[0]),
                        "measured": float(((Y - centred[H](X)) ** 2).sum()) / energy,
                        "predicted, no mean path": exact / float(tails[0]),
                        "measured, no mean path": float(((Y - plain[H](X)) ** 2).sum()) / energy})
    return records


def truncation_sweep(model: SequenceClassifier, X: Any, y: Any, moments: Sequence[InputMoments],
                     heads: Sequence[int], blocks: Sequence[int]) -> list[dict]:
    """Accuracy when the mixing layers `blocks` (0-based) are replaced by their H-head truncations.

    One record per H in heads: "H", "accuracy" on (X (b, n, in_width), y (b,)), and "logit
    change", max |logits − trained logits| / max |trained logits|.  Layers are truncated with the
    mean path under moments[m], the moments of layer m's inputs (`input_moments` of the trained
    model's `layer_inputs`, for instance); blocks before the first replaced one run once.
    """
    if not isinstance(model, SequenceClassifier):
        raise TypeError(f"model must be a SequenceClassifier; got {type(model).__name__}")
    X, y = _as_batch(X, model, "X"), np.asarray(y)
    blocks = sorted({check_int(m, "blocks[...]", minimum=0) for m in blocks})
    if not blocks or blocks[-1] >= len(model.layers) or len(moments) != len(model.layers):
        raise ValueError(f"blocks must be a non-empty subset of 0..{len(model.layers) - 1} and moments hold one "
                         f"InputMoments per layer; got blocks {blocks} and {len(moments)} moments")
    n = X.shape[1]
    cut = {m: truncations(model.layers[m], n, heads, moments[m]) for m in blocks}
    with torch.no_grad():
        h = model._encode(X)
        for m in range(blocks[0]):
            h = model._block(m, h)
        reference = logits(model, X)
        records = []
        for H in heads:
            z = h
            for m in range(blocks[0], len(model.layers)):
                z = model._block(m, z, cut[m][H] if m in cut else None)
            out = model.decoder(z.mean(1)).double().numpy()
            records.append({"H": H, "accuracy": float((out.argmax(1) == y).mean()),
                            "logit change": float(np.abs(out - reference).max() / np.abs(reference).max())})
    return records


def accuracy_knee(heads: Sequence[int], accuracies: Sequence[float], reference: float,
                  tolerance: float = 0.01) -> int:
    """The least H in `heads` (increasing) from which every accuracy stays >= reference − tolerance.

    heads and accuracies: equal lengths; ValueError if even the last accuracy is below.
    """
    heads, accuracies = list(heads), np.asarray(accuracies, dtype=float)
    if len(heads) != len(accuracies) or not heads or any(b <= a for a, b in zip(heads, heads[1:])):
        raise ValueError("heads must be increasing and as long as accuracies")
    tolerance = check_real(tolerance, "tolerance", nonnegative=True)
    good = accuracies >= check_real(reference, "reference") - tolerance
    if not good[-1]:
        raise ValueError(f"accuracies never stay within {tolerance} of {reference}: the last is {accuracies[-1]}")
    bad = np.flatnonzero(~good)
    return heads[0] if not len(bad) else heads[bad[-1] + 1]


# -- reports: one record per model or layer, for the tables of the chapter ----------------------


def accuracy_report(models: dict[str, SequenceClassifier], X: Any, y: Any) -> list[dict]:
    """One record per named classifier: "model", "test accuracy" on (X (b, n, in_width), y (b,)),
    its 95 % Wilson interval "95 % low", "95 % high", and the number of "parameters"."""
    records = []
    for name, model in models.items():
        right = round(accuracy(model, X, y) * len(y))
        low, high = wilson_interval(right, len(y))
        records.append({"model": name, "test accuracy": right / len(y), "95 % low": low, "95 % high": high,
                        "parameters": sum(p.numel() for p in model.parameters())})
    return records


def lag_span_report(layer: DiagonalSSM | SharedStateSSM, n: int, *, digits: int = 50) -> dict:
    """"k" (`exact_lag_span_dimension`), "generic" (`generic_lag_span_dimension`), "float64 rank"
    (`min_heads`), "σ_k/σ_1" and "route" of a trained layer on length n."""
    from .heads import min_heads

    exact = exact_lag_span_dimension(layer, n, digits=digits)
    return {"k": exact.k, "generic": generic_lag_span_dimension(layer, n), "float64 rank": min_heads(layer, n),
            "σ_k/σ_1": exact.smallest_kept, "route": exact.route}


def head_counts(layer: Any, n: int, epsilons: Sequence[float], covariance: Any) -> dict:
    """H_ε = `heads_needed` for each ε in epsilons, under the covariance ("H ε=…") and under white
    tokens ("white ε=…")."""
    from .heads import heads_needed

    counts = {f"H ε={e:g}": heads_needed(layer, n, e, covariance=covariance) for e in epsilons}
    return counts | {f"white ε={e:g}": heads_needed(layer, n, e) for e in epsilons}


def truncation_error_samples(layer: Any, n: int, heads: Sequence[int], moments: InputMoments, X: Any, *,
                             centre: bool = True) -> np.ndarray:
    """Σ_i ‖y_i − ŷ_i‖² for every sequence of X (b, n, d) and every H-head truncation (`truncations`
    with `centre`): shape (len(heads), b); y is the layer's output."""
    layer = _check_lti(layer)
    X, _ = as_real_tensor(X, "X", dtype=torch.float64)
    if X.ndim != 3 or tuple(X.shape[1:]) != (check_int(n, "n"), layer.d):
        raise ValueError(f"X must have shape (b, {n}, {layer.d}); got {tuple(X.shape)}")
    models = truncations(layer, n, heads, moments, centre=centre)
    with torch.no_grad():
        Y = layer._forward(X.to(layer.dtype)).double().numpy()
    return np.stack([((Y - models[H](X.numpy())) ** 2).sum(axis=(1, 2)) for H in heads])
