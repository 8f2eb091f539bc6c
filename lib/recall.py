"""Delayed recall: the training consequence of the gradient highway.

The task: a sequence of n tokens in ℝ^K carries a class token e_c (c one of K
classes) at position n − 1 − D and background tokens elsewhere; the model must
output c at the last position.  The only useful gradient path runs over distance D:
for a stable LTI SSM its strength is ‖C A^D B‖ = O(ρ^D)
({prf:ref}`thm-ssm-gradient-decay`), for attention with a learned position bias it
is α_{n−1,n−1−D} V, which does not shrink with D ({prf:ref}`prop-attention-highway`).

Three small trainable models (torch nn.Modules whose forward passes run lib's
LinearSSM and SoftmaxAttention with the modules' parameters) and `train_recall`,
a short seeded run (Adam by default) returning test accuracy and loss.

What the background does: with noisy background tokens (the default, noise 0.5)
the weak lag-D signal must beat the O(1) contributions of the nearby noise, both
in the output and in the gradient, and the SSM fails beyond a few steps.  With a
blank background (noise 0) nothing competes with the lag-D path and Adam, which
rescales every parameter's step, trains the SSM to full accuracy even at D = 128
(its eigenvalue moduli move towards 1); plain SGD then shows the raw attenuation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import check_choice, check_int, check_real
from .attention import SoftmaxAttention
from .ssm import LinearSSM
from .training import check_device

__all__ = [
    "RecallTask",
    "RecallSSM",
    "RecallAttention",
    "RecallHybrid",
    "RecallResult",
    "recall_model",
    "initial_gradient_norm",
    "train_recall",
    "recall_sweep",
]

Progress = Callable[[str], None] | None


@dataclass(frozen=True)
class RecallTask:
    """Recall the class token seen D steps before the end.

    A sequence has length n = distance + 1 + lead.  Position n − 1 − distance holds
    e_c ∈ ℝ^K for a uniformly random class c; every other position holds
    background noise N(0, noise² I_K).  The target is c, read at position n − 1.

    Attributes:
        distance: D >= 0.
        classes: K >= 2 (also the token width d).
        noise: standard deviation of the background tokens, >= 0.
        lead: background tokens before the class token, >= 0.
    """

    distance: int
    classes: int = 8
    noise: float = 0.5
    lead: int = 0

    def __post_init__(self) -> None:
        check_int(self.distance, "distance", minimum=0)
        check_int(self.classes, "classes", minimum=2)
        check_real(self.noise, "noise", nonnegative=True)
        check_int(self.lead, "lead", minimum=0)

    @property
    def length(self) -> int:
        """n = distance + 1 + lead."""
        return self.distance + 1 + self.lead

    def sample(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of sequences and labels.

        Args:
            batch: number of sequences, >= 1.
            generator: a torch.Generator (the only source of randomness).

        Returns:
            X of shape (batch, n, K) in float64 and labels of shape (batch,) (int64).
        """
        batch = check_int(batch, "batch")
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
        labels = torch.randint(self.classes, (batch,), generator=generator)
        X = self.noise * torch.randn(batch, self.length, self.classes, generator=generator, dtype=torch.float64)
        X[:, self.lead] = F.one_hot(labels, self.classes).to(torch.float64)
        return X, labels


def _last_output(attention: SoftmaxAttention, X: torch.Tensor) -> torch.Tensor:
    """attention(X)[:, −1] for X of shape (b, n, d), computing only the last query's row.

    Uses the layer's own projections, scores (scaling, position bias, causal mask)
    and output map, so it equals lib's forward at position n − 1 (tested) at 1/n of
    the cost of all n queries — the training budget needs that.
    """
    Q, K, V = attention._project(X)
    weights = torch.softmax(attention._score_rows(Q[:, :, -1:], K, X.shape[1] - 1), dim=-1)  # (b, H, 1, n)
    return attention._output(weights @ V)[:, 0]


def _normal(generator: torch.Generator, *shape: int, std: float) -> torch.nn.Parameter:
    return torch.nn.Parameter(std * torch.randn(*shape, generator=generator, dtype=torch.float64))


class RecallSSM(torch.nn.Module):
    """A stable LTI SSM read out at the last position: logits = y_{n−1} = Σ_ℓ C A^ℓ B x_{n−1−ℓ}.

    A is real block diagonal with N/2 rotation-scaling blocks r_k R(θ_k), i.e.
    eigenvalues r_k e^{±iθ_k} with moduli r_k = sigmoid(ν_k) ∈ (0, 1): stable for
    every parameter value.  The init matters: r_k uniform in `radius`
    (default (0.85, 0.95), so ρ ≈ 0.9 and ‖L_D‖ ~ 0.9^D at the start),
    θ_k uniform in [0, π], B and C Gaussian with variance 1/fan-in.  An init
    near the unit circle (LRU-style, r ∈ (0.99, 0.999)) removes the attenuation
    of the lag-D gradient at the start; on the noisy task it helped little in our
    runs (D = 32: accuracy ≈ 0.18 against 0.13), because the kernel must also
    single out lag D from its noisy neighbours, which a few decaying modes cannot.

    Args:
        classes: K (input and output width).
        state_size: N, even.
        radius: (lo, hi) range of the initial eigenvalue moduli, inside (0, 1).
        seed: seeds a torch.Generator for the init.
    """

    def __init__(self, classes: int, state_size: int = 16, *, radius: tuple[float, float] = (0.85, 0.95),
                 seed: int = 0) -> None:
        super().__init__()
        K, N = check_int(classes, "classes", minimum=2), check_int(state_size, "state_size", minimum=2)
        if N % 2:
            raise ValueError(f"state_size must be even (complex pairs); got {N}")
        lo, hi = (check_real(r, "radius") for r in radius)
        if not 0 < lo <= hi < 1:
            raise ValueError(f"radius must satisfy 0 < lo <= hi < 1; got {radius!r}")
        g = torch.Generator().manual_seed(seed)
        r = lo + (hi - lo) * torch.rand(N // 2, generator=g, dtype=torch.float64)
        self.logit_radius = torch.nn.Parameter(torch.log(r / (1 - r)))
        self.angle = torch.nn.Parameter(math.pi * torch.rand(N // 2, generator=g, dtype=torch.float64))
        self.B = _normal(g, N, K, std=1 / math.sqrt(K))
        self.C = _normal(g, K, N, std=1 / math.sqrt(N))

    def state_matrix(self) -> torch.Tensor:
        """A, shape (N, N): blocks r_k [[cos θ_k, −sin θ_k], [sin θ_k, cos θ_k]]."""
        r = torch.sigmoid(self.logit_radius)
        c, s = r * torch.cos(self.angle), r * torch.sin(self.angle)
        blocks = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)  # (N/2, 2, 2)
        return torch.block_diag(*blocks)

    def ssm(self) -> LinearSSM:
        """The current layer as a lib LinearSSM (differentiable in the parameters)."""
        return LinearSSM(self.state_matrix(), self.B, self.C)

    def sequence(self, X: torch.Tensor) -> torch.Tensor:
        """All outputs, (b, n, K) -> (b, n, K)."""
        return self.ssm()(X, method="fft")

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Logits at the last position, (b, n, K) -> (b, K).

        Row n − 1 of the operator identity, y_{n−1} = Σ_ℓ L_ℓ x_{n−1−ℓ}, with the
        layer's own lags L_ℓ = C A^ℓ B: equal to `sequence(X)[:, -1]` (tested) and
        much cheaper than producing all n outputs.
        """
        lags = self.ssm()._lags(X.shape[1])  # (n, K, K), differentiable
        return torch.einsum("lpd,bld->bp", lags, X.flip(1))


class RecallAttention(torch.nn.Module):
    """One causal softmax-attention head with a learned relative-position bias, read at the last position.

    logits = Σ_j α_{n−1,j} W_O W_V x_j with scores q·k/√K + b[n−1−j]; the bias b
    (one entry per lag, zero at init) is the learned positional information that
    lets the head find lag D.  W_Q, W_K, W_V, W_O Gaussian with variance 1/K.

    Args:
        classes: K.
        max_length: longest sequence (length of b).
        seed: seeds a torch.Generator for the init.
    """

    def __init__(self, classes: int, max_length: int, *, seed: int = 0) -> None:
        super().__init__()
        K, n_max = check_int(classes, "classes", minimum=2), check_int(max_length, "max_length")
        g = torch.Generator().manual_seed(seed)
        self.W_Q, self.W_K, self.W_V, self.W_O = (_normal(g, 1, K, K, std=1 / math.sqrt(K)) for _ in range(4))
        self.position_bias = torch.nn.Parameter(torch.zeros(1, n_max, dtype=torch.float64))

    def attention(self) -> SoftmaxAttention:
        """The current layer as a lib SoftmaxAttention (differentiable in the parameters)."""
        return SoftmaxAttention(self.W_Q, self.W_K, self.W_V, self.W_O, position_bias=self.position_bias)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Logits at the last position, (b, n, K) -> (b, K)."""
        return _last_output(self.attention(), X)


class RecallHybrid(torch.nn.Module):
    """A residual SSM layer then an attention read-out: z = x + ssm(x), logits = attn(z)_{n−1}.

    The Jamba-like pattern in miniature (the SSM as in RecallSSM, the attention as
    in RecallAttention).  The attention output is not added back to z_{n−1}: that
    residual would put the last background token straight into the logits.

    Args:
        classes: K.
        max_length: longest sequence.
        state_size: N of the SSM layer.
        radius: initial eigenvalue moduli of the SSM layer.
        seed: seeds the two layers (seed and seed + 1).
    """

    def __init__(self, classes: int, max_length: int, state_size: int = 16, *,
                 radius: tuple[float, float] = (0.85, 0.95), seed: int = 0) -> None:
        super().__init__()
        self.ssm_layer = RecallSSM(classes, state_size, radius=radius, seed=seed)
        self.attention_layer = RecallAttention(classes, max_length, seed=seed + 1)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Logits at the last position, (b, n, K) -> (b, K)."""
        Z = X + self.ssm_layer.sequence(X)
        return _last_output(self.attention_layer.attention(), Z)


KINDS = ("ssm", "attention", "hybrid")


def recall_model(kind: str, task: RecallTask, *, seed: int = 0,
                 radius: tuple[float, float] = (0.85, 0.95)) -> torch.nn.Module:
    """A fresh model of the given kind ("ssm", "attention" or "hybrid") sized for `task`.

    `radius` is the range of the SSM layer's initial eigenvalue moduli (ssm and hybrid).
    """
    kind = check_choice(kind, "kind", KINDS)
    if not isinstance(task, RecallTask):
        raise TypeError(f"task must be a RecallTask; got {type(task).__name__}")
    if kind == "ssm":
        return RecallSSM(task.classes, radius=radius, seed=seed)
    if kind == "attention":
        return RecallAttention(task.classes, task.length, seed=seed)
    return RecallHybrid(task.classes, task.length, radius=radius, seed=seed)


@dataclass(frozen=True)
class RecallResult:
    """The outcome of one training run.

    Attributes:
        distance: D.
        seed: the run's seed.
        steps: optimiser steps taken.
        accuracy: fraction of correct argmax predictions on the test batch.
        loss: mean cross-entropy on the test batch.
        train_loss: mean cross-entropy over the last 10% of training steps.
        kind: the model kind if known ("" otherwise).
    """

    distance: int
    seed: int
    steps: int
    accuracy: float
    loss: float
    train_loss: float
    kind: str = ""


def train_recall(model: torch.nn.Module, task: RecallTask | int, *, steps: int = 200, seed: int = 0,
                 batch: int = 16, lr: float = 0.02, optimizer: str = "adam", test_size: int = 256,
                 progress: Progress = None, kind: str = "", device: str | torch.device = "cpu") -> RecallResult:
    """Train `model` on the delayed-recall task; return test accuracy and loss.

    Fresh batches every step from a torch.Generator seeded with `seed`; the test
    batch comes from a second generator (seed + 1_000_003), so results are
    deterministic for a given seed, model init and thread count.  Both generators
    are CPU generators whatever `device` is (batches are moved after sampling), so
    the data stream does not depend on the device.

    Args:
        model: a module mapping (b, n, K) float64 to logits (b, K) (trained in place).
        task: a RecallTask, or a distance D for RecallTask(D).
        steps: optimiser steps.
        seed: seed of the data stream.
        batch: sequences per step.
        lr: learning rate.
        optimizer: "adam" (default) or "sgd" (with momentum 0.9).  Adam rescales
            each parameter's step, which partly hides how small a gradient is;
            SGD shows the raw gradient magnitudes.
        test_size: sequences in the test batch.
        progress: called with a one-line status now and then (terminal output).
        kind: a label stored in the result.
        device: torch device of the computation ("cpu", "cuda", "cuda:1", ...).  The
            model is moved there for training (`model.to(device)`, in place) and back
            to the CPU at the end, also if training fails.  ValueError if the device
            is unknown or its backend unavailable.  Tested on CPU only in this book's CI.

    Returns:
        RecallResult.

    Raises:
        FloatingPointError: if the loss becomes NaN or infinite (lr too large).
    """
    task = RecallTask(task) if isinstance(task, int) and not isinstance(task, bool) else task
    if not isinstance(task, RecallTask):
        raise TypeError(f"task must be a RecallTask or an int distance; got {type(task).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    steps, batch = check_int(steps, "steps"), check_int(batch, "batch")
    test_size = check_int(test_size, "test_size")
    lr = check_real(lr, "lr", positive=True)
    optimizer = check_choice(optimizer, "optimizer", ("adam", "sgd"))
    device = check_device(device)
    data = torch.Generator().manual_seed(seed)
    X_test, y_test = (t.to(device) for t in task.sample(test_size, torch.Generator().manual_seed(seed + 1_000_003)))
    model.to(device)  # in place (the Parameter objects are kept); moved back below
    try:
        optimiser = (torch.optim.Adam(model.parameters(), lr=lr) if optimizer == "adam"
                     else torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
        tail, losses = max(1, steps // 10), []
        for step in range(steps):
            X, y = (t.to(device) for t in task.sample(batch, data))
            loss = F.cross_entropy(model(X), y)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"training diverged at step {step} (loss {loss.item()}); lower lr")
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
            if progress is not None and (step + 1) % max(1, steps // 4) == 0:
                progress(f"recall {kind or type(model).__name__} D={task.distance} seed={seed}: "
                         f"step {step + 1}/{steps}, loss {np.mean(losses[-tail:]):.3f}")
        with torch.no_grad():
            logits = model(X_test)
            accuracy = float((logits.argmax(-1) == y_test).to(torch.float64).mean())
            test_loss = float(F.cross_entropy(logits, y_test))
    finally:
        model.to("cpu")
    return RecallResult(distance=task.distance, seed=seed, steps=steps, accuracy=accuracy, loss=test_loss,
                        train_loss=float(np.mean(losses[-tail:])), kind=kind)


def initial_gradient_norm(model: torch.nn.Module, task: RecallTask, *, samples: int = 256, seed: int = 0) -> float:
    """‖∂loss/∂θ‖ at the model's current parameters: the learning signal before training.

    The loss is the cross-entropy of `train_recall` on `samples` sequences from a
    generator seeded with `seed`; the norm is taken over all parameters together.  On a
    blank background (task.noise = 0) the class token at distance D is the only input,
    so for `RecallSSM` every gradient path runs through the lag-D kernel C A^D B and the
    norm falls like ρ^D ({prf:ref}`thm-ssm-gradient-decay`); for `RecallAttention` the
    path is the one-hop α V and the norm does not fall exponentially
    ({prf:ref}`prop-attention-highway`).

    Args:
        model: a recall model (module mapping (b, n, K) to logits (b, K)); not modified.
        task: the RecallTask whose batch is used.
        samples: sequences in the batch.
        seed: seed of the batch.

    Returns:
        The Euclidean norm of the gradient of the loss over all parameters.
    """
    if not isinstance(task, RecallTask):
        raise TypeError(f"task must be a RecallTask; got {type(task).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    X, y = task.sample(check_int(samples, "samples"), torch.Generator().manual_seed(seed))
    parameters = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(F.cross_entropy(model(X), y), parameters, allow_unused=True)
    return float(torch.sqrt(sum((g ** 2).sum() for g in grads if g is not None)))


def recall_sweep(distances: tuple[int, ...] = (2, 8, 32, 128), kinds: tuple[str, ...] = KINDS,
                 seeds: tuple[int, ...] = (0, 1, 2), *, steps: int = 200, classes: int = 8, noise: float = 0.5,
                 optimizer: str = "adam", lr: float = 0.02, radius: tuple[float, float] = (0.85, 0.95),
                 progress: Progress = None, device: str | torch.device = "cpu") -> list[RecallResult]:
    """Train every (kind, distance, seed) combination from scratch; one RecallResult each.

    The model of run (kind, D, seed) is initialised with `seed` and trained on the
    data stream of `seed`.

    Args:
        distances: the distances D.
        kinds: model kinds ("ssm", "attention", "hybrid").
        seeds: seeds (init and data).
        steps, classes, noise, optimizer, lr: passed to train_recall / RecallTask.
        radius: initial eigenvalue moduli of the SSM layers (see `RecallSSM`).
        progress: terminal progress lines.
        device: torch device every run trains on (see `train_recall`); checked
            before the first run.  Tested on CPU only in this book's CI.

    Returns:
        list of RecallResult in the order kinds × distances × seeds.
    """
    device = check_device(device)
    results = []
    for kind in kinds:
        for D in distances:
            task = RecallTask(D, classes=classes, noise=noise)
            for seed in seeds:
                model = recall_model(kind, task, seed=seed, radius=radius)
                results.append(train_recall(model, task, steps=steps, seed=seed, optimizer=optimizer, lr=lr, kind=kind,
                                            device=device))
                if progress is not None:
                    r = results[-1]
                    progress(f"recall {kind:9s} D={D:4d} seed={seed}: accuracy {r.accuracy:.3f}, loss {r.loss:.3f}")
    return results
