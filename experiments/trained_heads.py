"""Trained SSMs on real data ({ref}`chap-trained-heads`): digits read pixel by pixel, classifiers
built from lib's layers, and what their trained layers are as head models.

The data are scikit-learn's bundled 8 × 8 digits (1,797 images, nothing downloaded), scaled to
[0, 1] and read row by row: sequences of n = 64 tokens of width 1. A classifier is an encoder
(1 → d), residual blocks h ← h + W GELU(layer(LayerNorm h)) around a mixing layer
(`DiagonalSSM`, `SharedStateSSM`, `SoftmaxAttention`, or a truncation), mean pooling over
positions and a decoder (d → 10). The analysis replaces a trained LTI layer by its optimal
H-head truncation under the moments (x̄, Σ) of the layer's own inputs
({prf:ref}`prop-covariance-head-count`), with the exact mean path, and measures what the
classifier loses. Helpers take numpy arrays and return float64 numpy; models take tensors.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from lib import (DiagonalSSM, MambaBlock, RelativeHeads, SharedStateSSM, SoftmaxAttention, channel_span, fit,
                 heads_needed, interaction_span, min_heads, optimal_head_errors, population_error, relative_error,
                 truncated_heads)
from lib.scan import fft_causal_conv
from lib.spans import _coefficient_span, rank

from .blocks import heads_at  # H_ε of a span's singular values (prop-channel-span, part 3)

# -- data --------------------------------------------------------------------------------------


class DigitSequences(NamedTuple):
    """Images as sequences: X (b, 64, 1) float64 in [0, 1], y (b,) int64 labels 0..9."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


def load_digit_sequences(test_size: float = 0.25, seed: int = 0) -> DigitSequences:
    """`sklearn.datasets.load_digits` / 16, pixels row by row, split by a stratified
    `train_test_split(test_size=test_size, random_state=seed)`."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, test_size=test_size, stratify=y,
                                                        random_state=seed)
    return DigitSequences(X_train[..., None], y_train.astype(np.int64), X_test[..., None], y_test.astype(np.int64))


def validation_split(data: DigitSequences, size: float = 0.2, seed: int = 0) -> DigitSequences:
    """The training images of `data` split again, stratified (`train_test_split(test_size=size,
    random_state=seed)`): X_train/y_train the images to fit on, X_test/y_test the validation
    images. The test images of `data` are not used."""
    from sklearn.model_selection import train_test_split

    X_fit, X_val, y_fit, y_val = train_test_split(data.X_train, data.y_train, test_size=size, stratify=data.y_train,
                                                  random_state=seed)
    return DigitSequences(X_fit, y_fit, X_val, y_val)


def logistic_baseline(data: DigitSequences, C: float = 1.0) -> Any:
    """Multinomial logistic regression (lbfgs, inverse regularisation C) fitted on the 64 raw
    pixels of data.X_train: a fitted `sklearn.linear_model.LogisticRegression`."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=C, max_iter=5000).fit(data.X_train[..., 0], data.y_train)


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion successes / trials (z = 1.96: 95 %)."""
    p, z2 = successes / trials, z * z / trials
    centre, half = (p + z2 / 2) / (1 + z2), z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials)) / (1 + z2)
    return centre - half, centre + half


def mcnemar(right: Any, right_baseline: Any) -> tuple[int, int, float]:
    """The exact McNemar test of two classifiers scored on the same items.

    right, right_baseline: booleans (b,), item correct or not. Returns (only, only_baseline, p):
    the items only the first (only the baseline) gets right, and the two-sided p-value of the
    exact binomial test of only ~ Bin(only + only_baseline, ½), min(1, 2 P(X <= min)); 1 if no
    item is discordant.
    """
    right, right_baseline = np.asarray(right, dtype=bool), np.asarray(right_baseline, dtype=bool)
    only, only_baseline = int((right & ~right_baseline).sum()), int((~right & right_baseline).sum())
    trials = only + only_baseline
    tail = sum(math.comb(trials, i) for i in range(min(only, only_baseline) + 1)) / 2.0 ** trials
    return only, only_baseline, min(1.0, 2.0 * tail)


# -- classifiers -------------------------------------------------------------------------------


class SequenceClassifier(torch.nn.Module):
    """logits = decoder(mean_i h_i), h ← h + W_m GELU(layer_m(LayerNorm_m h)) for m = 1..M, h = encoder(x) (+ P).

    layers: the mixing layers, torch modules (b, n, d) → (b, n, d) of one width d and dtype
    (lib models, or `CentredHeads`). positions: if an int n_max, a learned table P (n_max, d),
    N(0, 0.02²) at first, is added to the encoded tokens (as in GPT and ViT). seed: the torch
    initialisation of encoder, norms, mixers, decoder and P.
    """

    def __init__(self, layers: Sequence[torch.nn.Module], *, in_width: int = 1, classes: int = 10,
                 positions: int | None = None, seed: int = 0) -> None:
        super().__init__()
        d, dtype = layers[0].d, layers[0].dtype
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.encoder = torch.nn.Linear(in_width, d, dtype=dtype)
            self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d, dtype=dtype) for _ in layers)
            self.mixers = torch.nn.ModuleList(torch.nn.Linear(d, d, dtype=dtype) for _ in layers)
            self.decoder = torch.nn.Linear(d, classes, dtype=dtype)
            table = None if positions is None else 0.02 * torch.randn(positions, d)
        self.positions = None if table is None else torch.nn.Parameter(table.to(dtype))
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Logits (b, classes) of X (b, n, in_width) in the classifier's dtype."""
        h = self.encode(X)
        for m in range(len(self.layers)):
            h = self.block(m, h)
        return self.decoder(h.mean(1))

    def encode(self, X: torch.Tensor) -> torch.Tensor:
        """h = encoder(x) (+ P): the input of the first block, (b, n, d)."""
        h = self.encoder(X)
        return h if self.positions is None else h + self.positions[: X.shape[1]]

    def block(self, m: int, h: torch.Tensor, layer: torch.nn.Module | None = None) -> torch.Tensor:
        """Block m on h (b, n, d), with its mixing layer or `layer` in its place."""
        layer = self.layers[m] if layer is None else layer
        return h + self.mixers[m](F.gelu(layer(self.norms[m](h))))

    def layer_inputs(self, X: Any) -> list[np.ndarray]:
        """The input of every mixing layer (after its LayerNorm) on X (b, n, in_width): (b, n, d) each."""
        inputs = []
        with torch.no_grad():
            h = self.encode(self._tensor(X))
            for m in range(len(self.layers)):
                inputs.append(self.norms[m](h).double().numpy())
                h = self.block(m, h)
        return inputs

    def _tensor(self, X: Any) -> torch.Tensor:
        return torch.as_tensor(X).detach().to(self.encoder.weight.dtype)


def classifier(kind: str, d: int, *, state: int = 32, heads: int = 1, n: int = 64, blocks: int = 2,
               step_range: tuple[float, float] = (1e-3, 1e-1), seed: int = 0,
               dtype: torch.dtype = torch.float32) -> SequenceClassifier:
    """A `SequenceClassifier` with `blocks` mixing layers of width d (layer m seeded seed + m).

    "s4d-lin", "s4d-real": `DiagonalSSM.random(d, state, init="lin" | "real")` (S4D);
    "s5": `SharedStateSSM.random(d, state)`; "attention": causal `SoftmaxAttention.random` with
    `heads` heads (d_k = d_v = d / heads), zero relative-position scores for lengths <= n and a
    learned absolute position table; "mamba": `MambaBlock(d, d_state=state, seed=seed + m)`,
    Mamba's mixer at its standard initialisation (d_conv 4, expand 2, step rank ⌈d/16⌉; the
    `step_range` is not used: Mamba's own [1e-3, 1e-1]).
    """
    layers = []
    for m in range(blocks):
        if kind == "mamba":
            layers.append(MambaBlock(d, d_state=state, seed=seed + m, dtype=dtype))
        elif kind == "s5":
            layers.append(SharedStateSSM.random(d, state, step_range=step_range, seed=seed + m, dtype=dtype))
        elif kind == "attention":
            layers.append(SoftmaxAttention.random(d, d, heads, max_length=n, seed=seed + m, dtype=dtype))
        else:
            layers.append(DiagonalSSM.random(d, state, init=kind[4:], step_range=step_range, seed=seed + m,
                                             dtype=dtype))
    return SequenceClassifier(layers, positions=n if kind == "attention" else None, seed=seed)


def train_classifier(model: SequenceClassifier, data: DigitSequences, *, epochs: int, batch: int = 64,
                     lr: float = 3e-3, final_lr: float | None = None, seed: int = 0, device: Any = "cpu",
                     progress: Callable[[str], None] | None = None, label: str = "",
                     after_epoch: Callable[[int], None] | None = None) -> np.ndarray:
    """Train in place with `lib.fit` (Adam, cross-entropy) for `epochs` passes over the training set.

    Every epoch visits the training images once in a fresh order (torch.randperm on fit's
    seeded generator), in minibatches of `batch` (the last one smaller). after_epoch(e), if
    given, is called once e epochs are done, e = 1..epochs, with the model as it is then.
    Returns the loss of every step, shape (epochs · ⌈b / batch⌉,).
    """
    X = torch.tensor(data.X_train, dtype=model.encoder.weight.dtype)
    y = torch.tensor(data.y_train)

    def batches(generator: torch.Generator):
        for epoch in range(epochs):
            if epoch and after_epoch is not None:  # fit asks for the next batch after its last step
                after_epoch(epoch)
            order = torch.randperm(len(X), generator=generator)
            for start in range(0, len(X), batch):
                yield X[order[start:start + batch]], y[order[start:start + batch]]

    losses = fit(model, lambda net, X_b, y_b: F.cross_entropy(net(X_b), y_b), batches,
                 steps=epochs * -(-len(X) // batch), lr=lr, final_lr=final_lr, seed=seed, device=device,
                 progress=progress, label=label)
    if after_epoch is not None:
        after_epoch(epochs)
    return losses


def logits(model: SequenceClassifier, X: Any) -> np.ndarray:
    """The classifier's logits on X (b, n, in_width), without gradients: (b, classes)."""
    with torch.no_grad():
        return model(model._tensor(X)).double().numpy()


def correct(model: Any, X: Any, y: Any) -> np.ndarray:
    """Booleans (b,): the sequences X (b, n, in_width) a classifier labels y (b,). model: a
    `SequenceClassifier` (largest logit) or a fitted scikit-learn classifier of the pixels X[..., 0]."""
    if isinstance(model, torch.nn.Module):
        return logits(model, X).argmax(1) == np.asarray(y)
    return model.predict(np.asarray(X)[..., 0]) == np.asarray(y)


def accuracy(model: Any, X: Any, y: Any) -> float:
    """The fraction of sequences X (b, n, in_width) labelled y (b,) by the classifier (`correct`)."""
    return float(correct(model, X, y).mean())


def as_float64(model: SequenceClassifier) -> SequenceClassifier:
    """A float64 copy of the classifier (its lib layers then compute in float64)."""
    return copy.deepcopy(model).double()


def select_baseline(split: DigitSequences, Cs: Sequence[float]) -> tuple[Any, list[dict]]:
    """`logistic_baseline(split, C)` for each C in Cs; keep the one with the best accuracy on the
    validation images split.X_test (ties: the first in Cs). Returns (model, rows "C",
    "validation accuracy")."""
    models = {C: logistic_baseline(split, C) for C in Cs}
    rows = [{"C": C, "validation accuracy": accuracy(m, split.X_test, split.y_test)} for C, m in models.items()]
    return models[max(rows, key=lambda r: r["validation accuracy"])["C"]], rows


def select_setting(kind: str, split: DigitSequences, lrs: Sequence[float], epochs: Sequence[int], *, width: int,
                   batch: int, seed: int = 0, device: Any = "cpu", progress: Callable[[str], None] | None = None,
                   **options: Any) -> tuple[SequenceClassifier, list[dict]]:
    """The classifier of the training setting (lr, epochs) with the best validation accuracy.

    For each lr in lrs, `classifier(kind, width, seed=seed, **options)` is trained on
    split.X_train (`train_classifier`, constant rate, training seed `seed`) for max(epochs)
    epochs; after each number of epochs in `epochs` the model is scored on the validation
    images split.X_test and kept. A run of e epochs is the first e epochs of the longest run
    (constant rate, the same batches), so the grid lrs × epochs costs len(lrs) runs. Ties: the
    first setting in the order of lrs, then epochs. Returns (the kept model, rows "lr",
    "epochs", "validation accuracy").
    """
    kept, rows = {}, []
    for lr in lrs:
        model = classifier(kind, width, seed=seed, **options)

        def score(done: int, lr: float = lr, model: SequenceClassifier = model) -> None:
            if done in epochs:
                kept[lr, done] = copy.deepcopy(model)
                rows.append({"lr": lr, "epochs": done,
                             "validation accuracy": accuracy(model, split.X_test, split.y_test)})

        name = f"{kind} H={options.get('heads', 1)}" if kind == "attention" else kind
        train_classifier(model, split, epochs=max(epochs), batch=batch, lr=lr, seed=seed, device=device,
                         progress=progress, label=f"{name} lr {lr:g} seed {seed}", after_epoch=score)
    best = max(rows, key=lambda r: r["validation accuracy"])
    return kept[best["lr"], best["epochs"]], rows


# -- the exact lag span dimension of a trained layer (prop-trained-lag-span) --------------------


class LagSpanDimension(NamedTuple):
    """k; route ("modes" or "extended precision"); σ_k/σ_1 (smallest kept) and σ_{k+1}/σ_1
    (largest dropped, 0 if none) of the matrix whose rank is k."""

    k: int
    route: str
    smallest_kept: float
    largest_dropped: float


def generic_lag_span_dimension(layer: DiagonalSSM | SharedStateSSM, n: int) -> int | None:
    """The k_n of almost every parameter ({prf:ref}`prop-trained-lag-span`): min(n, d) for a
    DiagonalSSM, min(N + 1, n) for a SharedStateSSM with N <= d(d − 1); None for one with
    N > d(d − 1), where the proposition proves only the bound min(N + 1, n, d²)."""
    if isinstance(layer, SharedStateSSM):
        return min(layer.N + 1, n) if layer.N <= layer.d * (layer.d - 1) else None
    return min(n, layer.d)


def exact_lag_span_dimension(layer: DiagonalSSM | SharedStateSSM, n: int, *,
                             digits: int = 50) -> LagSpanDimension:
    """k_n = dim span{L_0..L_{n−1}} of a trained layer, by a route that float64 rounding cannot blur.

    SharedStateSSM: the rank of its residues (route "modes"; equal nodes merged, their residues
    summed, as λ = λ̄ for a real mode), {prf:ref}`prop-modal-lag-span` with the skip as the node
    0: needs n >= the number of distinct nodes, and nodes that are not merely rounding apart
    (rank rule rtol 1e-10). DiagonalSSM: the rank of the n × d matrix [K[q, ℓ] + δ_ℓ0 D_q] (the
    diagonals of the lags) computed by mpmath with `digits` significant digits from the
    float64 parameters (exact binary numbers), counting σ_q > 10^{−(digits − 10)} σ_1.
    """
    if isinstance(layer, SharedStateSSM):
        nodes, residues = (t.numpy() for t in layer.modes())
        distinct, index = np.unique(nodes, return_inverse=True)  # equal nodes share a residue
        merged = np.zeros((len(distinct), layer.d * layer.d), dtype=complex)
        np.add.at(merged, index.ravel(), residues.reshape(len(nodes), -1))
        return _ranked(np.linalg.svd(merged, compute_uv=False), 1e-10, "modes")
    return _ranked(_extended_kernel_singular_values(layer, n, digits), 10.0 ** (10 - digits), "extended precision")


def _ranked(sigma: np.ndarray, rtol: float, route: str) -> LagSpanDimension:
    k = int((sigma > rtol * sigma[0]).sum()) if sigma[0] > 0 else 0  # the rank rule of lib
    kept = float(sigma[k - 1] / sigma[0]) if k else 0.0
    dropped = float(sigma[k] / sigma[0]) if k < len(sigma) and sigma[0] > 0 else 0.0
    return LagSpanDimension(k, route, kept, dropped)


def _extended_kernel_singular_values(layer: DiagonalSSM, n: int, digits: int) -> np.ndarray:
    # Singular values of [K[q, ℓ] + δ_ℓ0 D_q] (n × d) in mpmath; the float64 parameters are exact binary numbers.
    import mpmath

    ctx = mpmath.MPContext()
    ctx.dps = digits
    par = {name: getattr(layer, name).detach().double().numpy() for name in ("log_dt", "A_log", "C", "D")}
    imag = layer.A_imag.detach().double().numpy() if layer.complex else np.zeros_like(par["A_log"])
    K = ctx.matrix(n, layer.d)
    for q in range(layer.d):
        step = ctx.exp(ctx.mpf(par["log_dt"][q]))
        for m in range(layer.M):
            lam = ctx.mpc(-ctx.exp(ctx.mpf(par["A_log"][q, m])), ctx.mpf(imag[q, m]))
            c = ctx.mpc(*par["C"][q, m]) if layer.complex else ctx.mpf(par["C"][q, m])
            weight, mu = c * ctx.expm1(step * lam) / lam, ctx.exp(step * lam)
            for ell in range(n):
                K[ell, q] += 2 * ctx.re(weight) if layer.complex else ctx.re(weight)
                weight *= mu
        K[0, q] += ctx.mpf(par["D"][q])
    return np.array([float(s) for s in ctx.svd_r(K, compute_uv=False)])


def with_copied_channel(layer: DiagonalSSM, source: int = 0, target: int = 1) -> DiagonalSSM:
    """A copy of an S4D layer whose channel `target` has every parameter of channel `source`:
    two equal lag diagonals, so k_n <= d − 1 (a non-generic parameter)."""
    twin = copy.deepcopy(layer)
    with torch.no_grad():
        for parameter in twin.parameters():
            parameter[target] = parameter[source]
    return twin


def without_skip(layer: DiagonalSSM | SharedStateSSM) -> DiagonalSSM | SharedStateSSM:
    """A copy of a layer with D = 0, its kernel alone. For S5 the node 0 then has no residue,
    so k_n <= N (non-generic)."""
    bare = copy.deepcopy(layer)
    with torch.no_grad():
        bare.D.zero_()
    return bare


def with_skip(layer: DiagonalSSM | SharedStateSSM, D: Any) -> DiagonalSSM | SharedStateSSM:
    """A copy of a layer with its skip replaced by D (d,): another layer's D on this kernel (a swap)."""
    twin = copy.deepcopy(layer)
    with torch.no_grad():
        twin.D.copy_(torch.as_tensor(np.asarray(D, dtype=np.float64)).to(twin.D.dtype))
    return twin


def skip_share(layer: DiagonalSSM | SharedStateSSM, n: int, covariance: Any = None) -> float:
    """The skip's share of the weighted lag energy: s / (s + ‖G_Σ‖²_F of the kernel alone), with
    s = n tr(diag(D) Σ diag(D)) the skip's and ‖G_Σ‖²_F = Σ_ℓ (n − ℓ) tr(K_ℓ Σ K_ℓᵀ) the lags'
    of the layer with D = 0 (Σ = I if covariance is None). In [0, 1]."""
    kernel = without_skip(layer).lags(n).detach().double().numpy()
    S = np.eye(layer.d) if covariance is None else np.asarray(covariance, dtype=np.float64)
    weights = n - np.arange(n)
    rest = float(np.einsum("l,lpd,de,lpe->", weights, kernel, S, kernel))
    D = layer.D.detach().double().numpy()
    skip = n * float(D**2 @ np.diag(S))
    return skip / (skip + rest)


def hippo_n_modes(N: int) -> tuple[np.ndarray, np.ndarray]:
    """S5's HiPPO-N initialisation: the eigenvalues of the normal part A + ppᵀ of HiPPO-LegS
    (A_ij = −√(2i+1)√(2j+1) for i > j, A_ii = −(i + 1), p_i = √(i + ½)), N states; the N/2 with
    positive imaginary part as (A_log, A_imag) of a SharedStateSSM (λc = −e^{A_log} + i A_imag)."""
    i = np.arange(N)
    A = np.tril(-np.sqrt(2 * i[:, None] + 1) * np.sqrt(2 * i[None, :] + 1), -1) - np.diag(i + 1.0)
    p = np.sqrt(i + 0.5)
    eig = np.linalg.eigvals(A + np.outer(p, p))
    upper = eig[eig.imag > 0]
    upper = upper[np.argsort(upper.imag)]  # by frequency
    return np.log(-upper.real), upper.imag


def with_hippo_n(layer: SharedStateSSM) -> SharedStateSSM:
    """A copy of an S5 layer whose modes are HiPPO-N's (`hippo_n_modes`), everything else kept."""
    twin = copy.deepcopy(layer)
    A_log, A_imag = hippo_n_modes(layer.N)
    with torch.no_grad():
        twin.A_log.copy_(torch.from_numpy(A_log))
        twin.A_imag.copy_(torch.from_numpy(A_imag))
    return twin


def covariance_rank(covariance: Any, rtol: float = 1e-10) -> tuple[int, float]:
    """(rank of Σ counting eigenvalues > rtol·λ_1, largest dropped eigenvalue / λ_1 (0 if none))."""
    eig = np.linalg.eigvalsh(np.asarray(covariance, dtype=np.float64))[::-1]
    rank = int((eig > rtol * eig[0]).sum())
    return rank, float(max(eig[rank], 0.0) / eig[0]) if rank < len(eig) else 0.0


def flat_real_mode_layer(d: int, rates: Sequence[float], n: int) -> DiagonalSSM:
    """An S4D layer of real modes with a flat lag spectrum on length n: d channels, each with the
    modes λc = −r for r in rates (Δ = 1, λ = e^{−r}), D = 0, and C chosen so that the weighted
    kernels √(n − ℓ) K[q, ℓ], q = 1..d, are orthonormal vectors over ℓ (by a QR factorisation of
    the weighted modes): every σ_q(G) is 1. Needs d <= len(rates) <= n."""
    rates = np.asarray(rates, dtype=np.float64)
    ell = np.arange(n)[:, None]
    modes = np.sqrt(n - ell) * np.expm1(-rates) / -rates * np.exp(-rates * ell)  # √(n−ℓ) B̃_m λ_m^ℓ
    R = np.linalg.qr(modes)[1]
    C = np.linalg.solve(R, np.eye(len(rates))[:, :d]).T  # modes @ C[q] is the q-th column of Q
    return DiagonalSSM(np.zeros(d), np.tile(np.log(rates), (d, 1)), C, np.zeros(d))


# -- the moments of a layer's inputs and its truncation (prop-covariance-head-count) ------------


def input_moments(inputs: Any) -> tuple[np.ndarray, np.ndarray]:
    """(x̄ (d,), Σ (d, d)): mean and covariance (divisor count) of the tokens of inputs (b, n, d),
    every position of every sequence alike."""
    tokens = np.asarray(inputs, dtype=np.float64).reshape(-1, np.shape(inputs)[-1])
    mean = tokens.mean(0)
    centred = tokens - mean
    return mean, centred.T @ centred / len(tokens)


class CentredHeads(torch.nn.Module):
    """H heads on centred tokens plus the exact mean path: ŷ_i = Σ_h Σ_{ℓ<=i} c[h, ℓ] V_h (x_{i−ℓ} − x̄) + ȳ_i.

    With ȳ_i = Σ_{ℓ<=i} L_ℓ x̄, the layer's output on the constant token x̄, the error is that of
    the heads on the centred tokens ({prf:ref}`prop-covariance-head-count`, part 2). An affine
    map, not a factorized one unless x̄ = 0. heads: a RelativeHeads; mean: x̄ (d,); mean_path:
    ȳ (n_max, p). Forward: X (b, n, d) → (b, n, p), tensors in the heads' dtype, by an FFT
    convolution with L̂_ℓ = Σ_h c[h, ℓ] V_h (one p × d kernel whatever H).
    """

    def __init__(self, heads: RelativeHeads, mean: Any, mean_path: Any) -> None:
        super().__init__()
        self.heads, self.d, self.p, self.H = heads, heads.d, heads.p, heads.H
        self.register_buffer("mean", torch.as_tensor(mean).to(heads.dtype).clone())
        self.register_buffer("mean_path", torch.as_tensor(mean_path).to(heads.dtype).clone())

    @property
    def dtype(self) -> torch.dtype:
        return self.heads.dtype

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        kernel = self.heads.lags(n).to(X.dtype)
        return fft_causal_conv(X - self.mean.to(X.dtype), kernel, "fpd,bfd->bfp") + self.mean_path[:n].to(X.dtype)


def mean_path(layer: Any, n: int, mean: Any) -> np.ndarray:
    """ȳ_i = Σ_{ℓ<=i} L_ℓ x̄ for i < n: an LTI layer's output on the constant input x̄ (d,), shape (n, p)."""
    return np.cumsum(layer.lags(n).detach().double().numpy() @ np.asarray(mean, dtype=np.float64), axis=0)


def truncations(layer: Any, n: int, heads: Sequence[int], moments: tuple[Any, Any], *,
                centre: bool = True) -> dict[int, CentredHeads]:
    """The optimal H-head truncations of an LTI layer under tokens with moments (x̄, Σ), for H in heads.

    `truncated_heads(layer, n, H, covariance=Σ)` ({prf:ref}`prop-covariance-head-count`) on the
    centred tokens with the exact mean path (centre=True); centre=False: the same heads on the
    raw tokens (x̄, ȳ = 0), whose error gains the mean term of the proposition.
    """
    mean, covariance = moments
    mean = np.asarray(mean, dtype=np.float64) if centre else np.zeros(layer.d)
    path = mean_path(layer, n, mean)
    full = truncated_heads(layer, n, max(heads), covariance=covariance)  # the others are its first H
    return {H: CentredHeads(_first_heads(full, H), mean, path) for H in heads}


def _first_heads(heads: RelativeHeads, H: int) -> RelativeHeads:
    # The first H heads of a truncation: the truncation to H (the same top singular vectors).
    return RelativeHeads(heads.V.detach()[:H], heads.coefficients.detach()[:H], dtype=heads.dtype)


def _outputs(layer: Any, X: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return layer(torch.from_numpy(X).to(layer.dtype)).double().numpy()


def _applied(model: CentredHeads, X: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(X).to(model.dtype)).double().numpy()


def raw_moments(moments: tuple[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(0, Σ + x̄x̄ᵀ) for moments (x̄, Σ): the raw second moment as a covariance with mean 0.

    The truncation under these moments (`truncations`, `truncation_sweep`) has no centring and
    no bias: H heads with relative-position coefficients on the raw tokens, a factorized H-head
    model, built by part 2 of {prf:ref}`prop-covariance-head-count` as if the tokens were
    uncorrelated with second moment E[x xᵀ]. Its error is part 1's, mean term included; it is
    one bias-free H-head model, not the best one."""
    mean, covariance = (np.asarray(a, dtype=np.float64) for a in moments)
    return np.zeros_like(mean), covariance + np.outer(mean, mean)


def measured_head_counts(layer: Any, n: int, epsilons: Sequence[float], moments: tuple[Any, Any],
                         inputs: Any) -> dict:
    """H_ε on the measured error: the least H whose truncation (centred, with the mean path, as in
    `truncation_errors`) has Σ‖y − ŷ‖² <= ε Σ‖y − ȳ‖² on inputs (b, n, d), for each ε ("H ε=…").

    The heads of H < H' are the first H of H' (the top singular vectors of G_Σ), so one
    truncation is built and cut. H runs up from 0 until the smallest ε is met; an ε never met
    (the truncation at rank G_Σ still above it) gives None.
    """
    mean, covariance = moments
    X = np.asarray(inputs, dtype=np.float64)
    full = truncated_heads(layer, n, n * layer.d, covariance=covariance)
    path = mean_path(layer, n, mean)
    Y = _outputs(layer, X)
    energy = float(((Y - path) ** 2).sum())
    found: dict = {f"H ε={e:g}": None for e in epsilons}
    for H in range(full.H + 1):
        model = CentredHeads(_first_heads(full, H), mean, path)
        error = float(((Y - _applied(model, X)) ** 2).sum()) / energy
        for e in epsilons:
            if found[f"H ε={e:g}"] is None and error <= e:
                found[f"H ε={e:g}"] = H
        if error <= min(epsilons):
            break
    return found


def truncation_errors(layer: Any, n: int, heads: Sequence[int], moments: tuple[Any, Any],
                      inputs: Any) -> list[dict]:
    """Predicted and measured relative squared errors of a layer's H-head truncations, one row per H.

    All relative to the centred output energy. "predicted": Σ_{q>H} σ_q(G_Σ)² / ‖G_Σ‖²_F, the
    closed form for tokens iid over positions with the moments; "measured": Σ‖y − ŷ‖² / Σ‖y − ȳ‖²
    on inputs (b, n, d), y the layer's output, ŷ the truncation with the mean path ȳ;
    "measured, no mean path": the same heads on the raw tokens; "predicted, no mean path":
    its iid value with the mean term, `population_error(..., covariance=Σ, mean=x̄)` / ‖G_Σ‖²_F.
    """
    mean, covariance = moments
    X = np.asarray(inputs, dtype=np.float64)
    centred, plain = (truncations(layer, n, heads, moments, centre=c) for c in (True, False))
    tails = optimal_head_errors(layer, n, max(centred), covariance=covariance)
    Y = _outputs(layer, X)
    energy = float(((Y - mean_path(layer, n, mean)) ** 2).sum())
    rows = []
    for H in centred:
        exact = population_error(layer, plain[H].heads, n, covariance=covariance, mean=mean)
        rows.append({"H": H, "predicted": float(tails[H] / tails[0]),
                     "measured": float(((Y - _applied(centred[H], X)) ** 2).sum()) / energy,
                     "predicted, no mean path": exact / float(tails[0]),
                     "measured, no mean path": float(((Y - _applied(plain[H], X)) ** 2).sum()) / energy})
    return rows


def truncation_error_samples(layer: Any, n: int, heads: Sequence[int], moments: tuple[Any, Any], X: Any, *,
                             centre: bool = True) -> np.ndarray:
    """Σ_i ‖y_i − ŷ_i‖² for every sequence of X (b, n, d) and every H-head truncation (`truncations`
    with `centre`): shape (len(heads), b); y is the layer's output."""
    X = np.asarray(X, dtype=np.float64)
    models = truncations(layer, n, heads, moments, centre=centre)
    Y = _outputs(layer, X)
    return np.stack([((Y - _applied(models[H], X)) ** 2).sum(axis=(1, 2)) for H in heads])


def truncation_sweep(model: SequenceClassifier, X: Any, y: Any, moments: Sequence[tuple[Any, Any]],
                     heads: Sequence[int], blocks: Sequence[int], *, path_scale: float = 1.0) -> list[dict]:
    """Accuracy when the mixing layers `blocks` (0-based) are replaced by their H-head truncations.

    One row per H in heads: "H", "accuracy" on (X (b, n, in_width), y (b,)), and "logit
    change", max |logits − trained logits| / max |trained logits|. Layer m is truncated with
    the mean path under moments[m], the moments of its inputs (`input_moments` of the trained
    model's `layer_inputs`, for instance); blocks before the first replaced one run once.
    path_scale: every mean path ȳ multiplied by it (a negative control when ≠ 1).
    """
    X, y, blocks = model._tensor(X), np.asarray(y), sorted(blocks)
    n = X.shape[1]
    cut = {m: truncations(model.layers[m], n, heads, moments[m]) for m in blocks}
    for models in cut.values():
        for truncation in models.values():
            truncation.mean_path.mul_(path_scale)
    reference = logits(model, X)
    rows = []
    with torch.no_grad():
        h = model.encode(X)
        for m in range(blocks[0]):
            h = model.block(m, h)
        for H in heads:
            z = h
            for m in range(blocks[0], len(model.layers)):
                z = model.block(m, z, cut[m][H] if m in cut else None)
            out = model.decoder(z.mean(1)).double().numpy()
            rows.append({"H": H, "accuracy": float((out.argmax(1) == y).mean()),
                         "logit change": float(np.abs(out - reference).max() / np.abs(reference).max())})
    return rows


def exact_rank_network(model: SequenceClassifier, n: int, r: int,
                       moments: Sequence[tuple[Any, Any]]) -> SequenceClassifier:
    """A copy of the classifier whose mixing layer m is `truncated_heads(layer_m, n, r,
    covariance=Σ_m)`, Σ_m from moments[m]: a RelativeHeads of min(r, rank G_Σ) heads, an LTI
    layer whose lags L̂_ℓ = Σ_h c[h, ℓ] V_h span exactly that many dimensions (the V_h are
    independent, c has full rank) and whose G_Σ has the top singular values of the layer's."""
    network = copy.deepcopy(model)
    for m, layer in enumerate(model.layers):
        network.layers[m] = truncated_heads(layer, n, r, covariance=moments[m][1])
    return network


def covariance_singular_values(layer: Any, n: int, covariance: Any) -> np.ndarray:
    """σ_q(G_Σ), q = 1..min(n, pd): the rows √(n − ℓ) vec(L_ℓ Ω)ᵀ with Ω = U diag(√λ) over the
    eigenpairs of Σ with λ > 0 (numpy's eigh and svd, not lib's routes)."""
    lam, U = np.linalg.eigh(np.asarray(covariance, dtype=np.float64))
    omega = U * np.sqrt(np.clip(lam, 0.0, None))
    lags = layer.lags(n).detach().double().numpy() @ omega
    rows = np.sqrt(n - np.arange(n))[:, None] * lags.reshape(n, -1)
    return np.linalg.svd(rows, compute_uv=False)


def heads_within(heads: Sequence[int], accuracies: Sequence[float], reference: float, tolerance: float) -> int:
    """H_acc(τ): the least H in `heads` (increasing) from which every accuracy stays >= reference − τ.

    One-sided: an accuracy above the reference counts as within. Only the H in `heads` are
    looked at, so "stays" holds on that grid, not between its points. ValueError if even the
    last accuracy is below.
    """
    good = np.asarray(accuracies, dtype=float) >= reference - tolerance
    if not good[-1]:
        raise ValueError(f"accuracies never stay within {tolerance} of {reference}: the last is {accuracies[-1]}")
    bad = np.flatnonzero(~good)
    return list(heads)[0 if not len(bad) else bad[-1] + 1]


def resolvable_tolerances(tolerances: Sequence[float], items: int, alpha: float = 0.05) -> tuple[int, list[float]]:
    """(m, resolved): the fewest discordant items m with which the exact McNemar test (`mcnemar`)
    can reach p < alpha — all m one way, p = 2·2^-m — and the tolerances τ whose τ·items is at
    least m. An accuracy gap of fewer than m items on `items` test items is never significant."""
    m = next(m for m in range(1, 64) if mcnemar(np.ones(m, bool), np.zeros(m, bool))[2] < alpha)
    return m, [t for t in tolerances if t * items >= m]


#: A mean ε-head count change (over blocks and ε) below this many heads in absolute value reads
#: as "no change", at least this many as a gain: the one threshold of every notebook.
COUNT_CHANGE = 1.0


def count_change(before: Any, after: Any) -> float:
    """The mean change of the ε-head counts, arrays (blocks, ε) before and after training."""
    return float(np.mean(np.asarray(after, dtype=float) - np.asarray(before, dtype=float)))


# -- report rows: one per model or layer, for the tables of the chapter -------------------------


def paired_report(models: dict[str, Any], baseline: Any, X: Any, y: Any) -> list[dict]:
    """One row per named classifier, scored on (X (b, n, in_width), y (b,)) against `baseline`
    on the same items: "model", "test accuracy", its 95 % Wilson interval "95 % low", "95 %
    high", the items it alone ("only this") and the baseline alone ("only baseline") gets
    right, the exact McNemar p-value ("McNemar p", `mcnemar`) and the number of "parameters"."""
    right_baseline = correct(baseline, X, y)
    rows = []
    for name, model in models.items():
        right = correct(model, X, y)
        low, high = wilson_interval(int(right.sum()), len(right))
        only, only_baseline, p = mcnemar(right, right_baseline)
        rows.append({"model": name, "test accuracy": float(right.mean()), "95 % low": low, "95 % high": high,
                     "only this": only, "only baseline": only_baseline, "McNemar p": p,
                     "parameters": sum(q.numel() for q in model.parameters())})
    return rows


def lag_span_report(layer: DiagonalSSM | SharedStateSSM, n: int, *, digits: int = 50) -> dict:
    """"k" (`exact_lag_span_dimension`), "generic" (`generic_lag_span_dimension`), "float64 rank"
    (`min_heads`), "σ_k/σ_1", "σ_k+1/σ_1" of the matrix whose rank is k, that "matrix" ("lag
    diagonals, n × d" for S4D; "residues, nodes × d²" for S5: not the same matrix) and "route"
    of a layer on length n."""
    exact = exact_lag_span_dimension(layer, n, digits=digits)
    matrix = "residues, nodes × d²" if exact.route == "modes" else "lag diagonals, n × d"
    return {"k": exact.k, "generic": generic_lag_span_dimension(layer, n), "float64 rank": min_heads(layer, n),
            "σ_k/σ_1": exact.smallest_kept, "σ_k+1/σ_1": exact.largest_dropped, "matrix": matrix,
            "route": exact.route}


def precision_report(layer: DiagonalSSM, n: int, digits: int, more_digits: int) -> dict:
    """The extended-precision k of an S4D layer at two precisions: "k", "k, more digits",
    "σ_k/σ_1", its relative "change of σ_k" with more digits, and "σ_k+1/σ_1" at both (0 if
    k = d). A kept σ_k that is the layer's does not change; a dropped one that is zero falls
    with the precision."""
    a, b = (exact_lag_span_dimension(layer, n, digits=g) for g in (digits, more_digits))
    return {"k": a.k, "k, more digits": b.k, "σ_k/σ_1": a.smallest_kept,
            "change of σ_k": b.smallest_kept / a.smallest_kept - 1, "σ_k+1/σ_1": a.largest_dropped,
            "σ_k+1/σ_1, more digits": b.largest_dropped}


def head_counts(layer: Any, n: int, epsilons: Sequence[float], moments: tuple[Any, Any]) -> dict:
    """H_ε = `heads_needed` for each ε in epsilons, under the covariance Σ of moments (x̄, Σ)
    ("H ε=…"; the centred truncation's count, whatever x̄) and under white tokens ("white ε=…")."""
    counts = {f"H ε={e:g}": heads_needed(layer, n, e, covariance=moments[1]) for e in epsilons}
    return counts | {f"white ε={e:g}": heads_needed(layer, n, e) for e in epsilons}


# -- Mamba blocks in a classifier: their head count at the inputs ({prf:ref}`prop-channel-span`) ---


def block_head_counts(model: SequenceClassifier, X: Any, epsilons: Sequence[float], rtol: float = 1e-10) -> list[dict]:
    """The head count of every mixing layer (a `MambaBlock`) of a classifier at its inputs on X (b, n, in_width).

    Layer m is read at what it receives on X (after its LayerNorm, `layer_inputs`), by the span of
    {prf:ref}`prop-channel-span` (`channel_span`'s, from one computation of the coefficients): one
    row per block with "block" (1-based), "channels D", "rows of Γ" (b · n(n+1)/2), "heads at X"
    (the span's dimension, rule rtol), "rank Γ", "H ε=…" (`experiments.blocks.heads_at`: the
    unweighted operator-block error of part 3, every pair j <= i), "within window H ε=…" (the same
    on the pairs 0 <= i − j < d_conv, inside the convolution's window, where the skip acts),
    "beyond window H ε=…" (the pairs i − j >= d_conv, as `channel_span(..., min_lag=d_conv)`; None
    if n <= d_conv), "beyond window energy" (Σσ² of the pairs beyond the window over Σσ² of all
    pairs: Σσ²(ΓΩ^½) = Σ ‖𝒲_ij‖_F², the share of the operator's squared Frobenius norm at lags
    >= d_conv; 0.0 if n <= d_conv), "scan share" (Σ ‖𝒲^scan_ij‖_F² over Σ ‖𝒲_ij‖_F², all pairs;
    𝒲^scan the operator of the same block with its skip D_skip = 0: g is linear in ψ, so
    g = g^scan + g^skip exactly, and the two parts interfere within the window, so the shares of
    the scan and the skip need not add to 1), "scan beyond window share" (Σ ‖𝒲^scan_ij‖_F² at lags
    >= d_conv over all pairs: how far the scan's own operator reaches; 0.0 if n <= d_conv), "scan
    output ratio" (‖Σ_j 𝒲^scan_ij x_j‖ / ‖Σ_j 𝒲_ij x_j‖, Frobenius norms over the images, positions
    and channels: the scan's part of the linear output against the whole; the skip's part can
    cancel it, so it can exceed 1) and "λmin(Ω)/λmax(Ω)". Beyond the window the skip does not act (𝒲 = 𝒲^scan there), so
    "beyond window energy" = "scan share" × "scan beyond window share". The count is that of the
    linear part 𝒲 of the block; the offset β (the additive biases, `block_offsets`) is not a head.
    """
    rows = []
    for m, (layer, inputs) in enumerate(zip(model.layers, model.layer_inputs(X))):
        with torch.no_grad():  # the coefficients' pieces once; the scan's: the skip's term δ_im D σ(c_m) removed
            P, s, c = layer._pieces(torch.from_numpy(inputs).to(layer.dtype))
            skip = torch.eye(P.shape[1], dtype=P.dtype)[None, :, :, None] * layer.D * torch.sigmoid(c)[:, None]
            g, g_scan = (layer._combine(pieces, s).to(torch.float64) for pieces in (P, P - skip))
            U, V = (t.detach().to(torch.float64) for t in layer.factors())
            VX = torch.from_numpy(inputs).to(torch.float64) @ V.T  # (b, n, D): Σ_j 𝒲_ij x_j = U Σ_j g_ij ⊙ V x_j
            outputs = [torch.linalg.norm(torch.einsum("bijq,bjq->biq", h, VX) @ U.T) for h in (g, g_scan)]
        i, j = torch.tril_indices(g.shape[1], g.shape[1])
        lag, g, g_scan = i - j, g[:, i, j], g_scan[:, i, j]  # (b, pairs, D)
        inside, beyond = lag < layer.d_conv, lag >= layer.d_conv
        span, near = (_coefficient_span(g[:, keep].reshape(-1, g.shape[-1]), U, V, rtol)
                      for keep in (lag >= 0, inside))
        far = _coefficient_span(g[:, beyond].reshape(-1, g.shape[-1]), U, V, rtol) if beyond.any() else None
        omega = (U.T @ U) * (V @ V.T)  # ‖U diag(h) V‖_F² = hᵀ Ω h

        def energy(h):
            return float(torch.einsum("bpq,qr,bpr->", h, omega, h))

        lam, b, n = span.gram_eigenvalues, inputs.shape[0], inputs.shape[1]
        total = float((span.singular_values ** 2).sum())
        energy_far = 0.0 if far is None else float((far.singular_values ** 2).sum() / total)
        scan = energy(g_scan)
        rows.append({"block": m + 1, "channels D": len(lam), "rows of Γ": b * n * (n + 1) // 2,
                     "heads at X": span.dim, "rank Γ": rank(span.coefficient_singular_values, rtol)}
                    | {f"H ε={e:g}": heads_at(span.singular_values, e) for e in epsilons}
                    | {f"within window H ε={e:g}": heads_at(near.singular_values, e) for e in epsilons}
                    | {f"beyond window H ε={e:g}": None if far is None else heads_at(far.singular_values, e)
                       for e in epsilons}
                    | {"beyond window energy": energy_far, "scan share": scan / total,
                       "scan beyond window share": energy(g_scan[:, beyond]) / scan,
                       "scan output ratio": float(outputs[1] / outputs[0]),
                       "λmin(Ω)/λmax(Ω)": float(lam[0] / lam[-1])})
    return rows


def block_offsets(model: SequenceClassifier, X: Any) -> list[dict]:
    """The affine identity y_i = Σ_j 𝒲_ij(X) x_j + β_i(X) of every mixing layer (a `MambaBlock`)
    at its inputs on X (b, n, in_width), and the share of each part in the block's output.

    y is the block's forward (the selective scan); Σ_j 𝒲_ij x_j = U Σ_j g_ij(X) ⊙ (V x_j) from the
    block's `coefficients` and `factors` (the dense `operator` applied, without forming it), β the
    block's `offset` (from the additive biases: here the conv's). One row per
    block: "block", "identity error" (`relative_error` of Σ𝒲x + β against y: rounding if the
    coefficients and the offset are the block's: it sees an error that changes Σ𝒲x, not one that
    leaves it unchanged), "offset ratio" ‖β‖/‖y‖ and "linear ratio" ‖Σ𝒲x‖/‖y‖ (Frobenius norms over
    the images, positions and channels; norms of the two parts of a sum: they add to at least 1,
    their squares to 1 only for orthogonal parts, and either can exceed 1). The split 𝒲/β is that of {prf:ref}`prop-mamba-block`: the additive biases
    (the in-projection's on the scan's branch, the conv's, the out-projection's) in β; the step bias
    (dt_proj.bias, inside the softplus) and the gate's stay in the coefficients."""
    rows = []
    for m, (layer, inputs) in enumerate(zip(model.layers, model.layer_inputs(X))):
        with torch.no_grad():
            X_m = torch.from_numpy(inputs).to(layer.dtype)
            Y, beta = layer(X_m).double().numpy(), layer.offset(X_m).double().numpy()
            U, V = layer.factors()
            linear = (torch.einsum("bijq,bjq->biq", layer.coefficients(X_m), X_m @ V.T) @ U.T).double().numpy()
        norm = float(np.linalg.norm(Y))
        rows.append({"block": m + 1, "identity error": relative_error(linear + beta, Y),
                     "offset ratio": float(np.linalg.norm(beta)) / norm,
                     "linear ratio": float(np.linalg.norm(linear)) / norm})
    return rows


def dense_span_check(model: SequenceClassifier, X: Any, rtol: float = 1e-10) -> list[dict]:
    """Each mixing layer's span at its inputs on X (b, n, in_width) by two linear-algebra routes
    from the same coefficients: `channel_span` (Γ Ω^½, no operator formed) and `interaction_span`
    on the dense operator 𝒲 = U diag(g) V (b, n, n, d, d), both from the block's `coefficients`.
    It checks part 2 of {prf:ref}`prop-channel-span` (the Gram identity), not the coefficients:
    `block_offsets` checks their sum with the offset, Σ𝒲x + β, against the forward (blind to
    coefficient errors that leave that sum unchanged), and tests/lib/test_blocks.py checks the
    coefficients themselves.

    One row per block: "block", "heads at X" and "dense" (the two dimensions), "σ error" (max
    |σ_q − σ_q^dense| / σ_1 over the D values) and "dense σ_D+1/σ_1" (what the dense route has
    beyond D channels: rounding by construction, since 𝒲 is built from D channel maps)."""
    rows = []
    for m, (layer, inputs) in enumerate(zip(model.layers, model.layer_inputs(X))):
        fast, dense = channel_span(layer, inputs, rtol), interaction_span(layer, inputs, rtol)
        D, sigma = len(fast.gram_eigenvalues), dense.singular_values
        error = np.abs(fast.singular_values - sigma[:len(fast.singular_values)]).max() / sigma[0]
        beyond = float(sigma[D] / sigma[0]) if len(sigma) > D else 0.0
        rows.append({"block": m + 1, "heads at X": fast.dim, "dense": dense.dim, "σ error": float(error),
                     "dense σ_D+1/σ_1": beyond})
    return rows


# -- the wider Mamba block at mamba.ipynb's budget: an offline run (too slow for the build) ---------

#: Where `python -m experiments.trained_heads wider-mamba` writes its table (committed; the build
#: does not run it, and `make data` leaves the folder "offline" alone: bookbuild.results).
WIDER_MAMBA_TABLE = "trained-heads/offline/mamba-wider"


def wider_mamba_readings(data: DigitSequences, split: DigitSequences, baseline: Any, *, width: int, state: int,
                         lrs: Sequence[float], epoch_grid: Sequence[int], seeds: Sequence[int], batch: int,
                         epsilons: Sequence[float], span_images: int, subsets: int = 2, device: Any = "cpu",
                         progress: Callable[[str], None] | None = None, jobs: int = 1) -> tuple[list[dict], list[dict]]:
    """mamba.ipynb's recipe for a Mamba classifier of any width and state, with its readings.

    The page's selection (`select_setting` over lrs × epoch_grid, training seed seeds[0], scored on
    split's validation images), then seeds[1:] trained at the kept setting (`train_classifier`), as
    the page does; each seed scored on data's test images against `baseline` (`paired_report`), its
    fit on split.X_train beside the baseline's, and the mean ε-head count change (`count_change` of
    `block_head_counts`' "H ε=…", trained against the same seed's initial classifier) over both
    blocks and per block, on `subsets` consecutive disjoint groups of `span_images` test images
    (the page reads the first group only). Returns (the selection rows "lr", "epochs",
    "validation accuracy"; one row per seed: "seed", "lr", "epochs", "fitted images", "baseline
    fitted", "test accuracy", "only this", "only baseline", "McNemar p", "parameters", then for
    each group a..b of test images (0-based, inclusive) "mean change a–b", "block m change a–b").
    """
    if subsets < 1 or subsets * span_images > len(data.y_test):
        raise ValueError(f"subsets · span_images must be in [span_images, {len(data.y_test)}]; "
                         f"got subsets={subsets}, span_images={span_images}")
    options = {"width": width, "state": state, "batch": batch, "device": device}
    # one selection run per rate, independent (select_setting's runs), so run side by side when jobs > 1
    runs = _starmap(select_setting, [("mamba", split, [lr], epoch_grid) for lr in lrs],
                    {"seed": seeds[0], "progress": progress, **options}, jobs)
    selection = [r for _, rows in runs for r in rows]  # in the order of lrs: select_setting's ties
    kept = max(selection, key=lambda r: r["validation accuracy"])  # as select_setting
    found = runs[[lr for lr in lrs].index(kept["lr"])][0]
    models = dict(zip(seeds[1:], _starmap(_trained_at, [(s, kept["lr"], kept["epochs"]) for s in seeds[1:]],
                                          {"split": split, "progress": progress, **options}, jobs)))
    baseline_fit = accuracy(baseline, split.X_train, split.y_train)
    columns = [f"H ε={e:g}" for e in epsilons]
    rows = []
    for s in seeds:
        initial = as_float64(classifier("mamba", width, state=state, seed=s))
        trained = as_float64(found if s == seeds[0] else models[s])
        report = paired_report({"": trained}, baseline, data.X_test, data.y_test)[0]
        row = {"seed": s, "lr": kept["lr"], "epochs": kept["epochs"],
               "fitted images": accuracy(trained, split.X_train, split.y_train), "baseline fitted": baseline_fit}
        row |= {k: report[k] for k in ("test accuracy", "only this", "only baseline", "McNemar p", "parameters")}
        for k in range(subsets):
            X = data.X_test[k * span_images:(k + 1) * span_images]
            before, after = ([[r[c] for c in columns] for r in block_head_counts(m, X, epsilons)]
                             for m in (initial, trained))
            where = f"{k * span_images}–{(k + 1) * span_images - 1}"
            row[f"mean change {where}"] = count_change(before, after)
            row |= {f"block {b + 1} change {where}": count_change(before[b], after[b]) for b in range(len(before))}
        rows.append(row)
    return selection, rows


def _trained_at(seed: int, lr: float, epochs: int, *, split: DigitSequences, width: int, state: int, batch: int,
                device: Any, progress: Callable[[str], None] | None) -> SequenceClassifier:
    """The Mamba classifier of `seed` trained on split for `epochs` epochs at rate lr (`train_classifier`)."""
    model = classifier("mamba", width, state=state, seed=seed)
    train_classifier(model, split, epochs=epochs, lr=lr, batch=batch, seed=seed, device=device, progress=progress,
                     label=f"mamba d={width} N={state} seed {seed}")
    return model


def _starmap(function: Callable, arguments: list[tuple], options: dict, jobs: int) -> list:
    """[function(*a, **options) for a in arguments], in `jobs` processes when jobs > 1 (same results:
    every run is seeded and independent; one torch thread each)."""
    if jobs <= 1 or len(arguments) <= 1:
        return [function(*a, **options) for a in arguments]
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    with ProcessPoolExecutor(min(jobs, len(arguments)), initializer=torch.set_num_threads, initargs=(1,)) as pool:
        return list(pool.map(partial(_star, function, options), arguments))


def _star(function: Callable, options: dict, a: tuple) -> Any:
    return function(*a, **options)


def write_wider_mamba(width: int = 16, state: int = 16, lrs: Sequence[float] = (0.03, 0.01),
                      seeds: Sequence[int] | None = None, jobs: int = 2, results: Any = None,
                      progress: Callable[[str], None] | None = None) -> Any:
    """Run `wider_mamba_readings` with mamba.ipynb's published parameters (data/params.yaml: split,
    epochs, seeds unless given, batch, baseline C, ε, images) except the width, state and rates given
    (its runs in `jobs` processes), and write
    its table `WIDER_MAMBA_TABLE` (selection rows first, "part" = "selection" / "seed") with a
    .meta.yaml recording how it was made. Returns the csv path."""
    import datetime
    import subprocess
    from pathlib import Path

    import pandas as pd
    import yaml

    root = Path(__file__).resolve().parent.parent
    p = yaml.safe_load((root / "data" / "params.yaml").read_text())["chapters/trained-heads/mamba.ipynb"]["published"]
    data = load_digit_sequences(p["test_size"], p["split_seed"])
    split = validation_split(data, p["validation_size"], p["split_seed"])
    params = {"width": width, "state": state, "lrs": [float(v) for v in lrs], "epoch_grid": p["epoch_grid"],
              "seeds": list(seeds or p["seeds"]), "batch": p["batch"], "epsilons": p["epsilons"],
              "span_images": p["span_images"], "subsets": 2, "device": p["device"]}
    selection, rows = wider_mamba_readings(data, split, logistic_baseline(split, p["baseline_C"]), progress=progress,
                                           jobs=jobs, **params)
    table = pd.DataFrame([{"part": "selection"} | r for r in selection] + [{"part": "seed"} | r for r in rows])
    csv = Path(results or root / "data" / "results") / f"{WIDER_MAMBA_TABLE}.csv"
    csv.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv, index=False, lineterminator="\n")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                            check=True).stdout.strip()
    meta = {"description": "the wider Mamba block (mamba.ipynb's recipe at another width, state and rates): "
                           "selection, test accuracy, fit, paired test, count changes",
            "command": f"python -m experiments.trained_heads wider-mamba {width} {state} "
                       + " ".join(f"{v:g}" for v in lrs) + " --seeds " + " ".join(map(str, params["seeds"])),
            "commit": commit, "date": datetime.date.today().isoformat(), "offline": True,
            "params": params | {"baseline_C": p["baseline_C"], "split_seed": p["split_seed"],
                                "test_size": p["test_size"], "validation_size": p["validation_size"]},
            "rtol": 0.0, "atol": 0.0}
    csv.with_name(csv.stem + ".meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=True))
    return csv


def wider_mamba_table(results: Any = None) -> tuple[Any, Any]:
    """The committed table of `write_wider_mamba` (data/results/`WIDER_MAMBA_TABLE`.csv, or under
    `results`), split into (the selection rows "lr", "epochs", "validation accuracy"; the seed
    rows), as pandas DataFrames without the columns that are empty in each part."""
    from pathlib import Path

    import pandas as pd

    folder = Path(results) if results else Path(__file__).resolve().parent.parent / "data" / "results"
    table = pd.read_csv(folder / f"{WIDER_MAMBA_TABLE}.csv")
    whole = ("epochs", "seed", "only this", "only baseline", "parameters")  # integers, whatever the empty cells
    parts = (table[table["part"] == p].drop(columns="part").dropna(axis=1, how="all").reset_index(drop=True)
             for p in ("selection", "seed"))
    return tuple(t.astype({c: int for c in whole if c in t}) for t in parts)


if __name__ == "__main__":  # python -m experiments.trained_heads wider-mamba [width state rate ...] [--seeds s ...]
    import sys

    args = sys.argv[1:]
    if args[:1] != ["wider-mamba"]:
        raise SystemExit("usage: python -m experiments.trained_heads wider-mamba [width state rate ...] [--seeds s ...]")
    given, seeds = (args[1:args.index("--seeds")], [int(v) for v in args[args.index("--seeds") + 1:]]) \
        if "--seeds" in args else (args[1:], None)
    shape = {"width": int(given[0]), "state": int(given[1])} if given else {}
    rates = {"lrs": [float(v) for v in given[2:]]} if given[2:] else {}
    print(write_wider_mamba(seeds=seeds, progress=print, **shape, **rates))
