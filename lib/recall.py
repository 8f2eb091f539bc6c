"""Delayed recall: the training consequence of the gradient highway ({ref}`chap-gradient-highway`).

A sequence of n tokens in ℝ^Q carries the one-hot token of one of Q classes at position
n − 1 − D and background tokens elsewhere; the model names the class at the last position.
The only useful gradient path runs over distance D: ‖C A^D B‖ = O(ρ^D) for a stable LTI SSM
({prf:ref}`thm-ssm-gradient-decay`),
α_{n−1,n−1−D} V for attention with a learned position bias ({prf:ref}`prop-attention-highway`).

The three models are lib models — a `LinearSSM` whose A is kept stable by a parametrisation,
a `SoftmaxAttention` head with position biases, and their residual `Stack` — read at the last
position and trained by `lib.fit`. With noisy backgrounds the weak lag-D signal must beat the
nearby noise and the SSM fails beyond a few steps; on a blank background Adam, which rescales
every step, trains the SSM at every distance tried (plain SGD then shows the attenuation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize

from ._validation import check_choice, check_int, check_real
from .attention import SoftmaxAttention
from .base import SequenceMap
from .ssm import LinearSSM
from .stacks import Stack
from .training import Progress, check_device, fit

KINDS = ("ssm", "attention", "hybrid")


@dataclass(frozen=True)
class RecallTask:
    """Recall the class token seen D steps before the end.

    A sequence has length n = distance + 1 + lead; position `lead` holds the one-hot token of
    a uniform class among Q = classes, every other position N(0, noise² I_Q); the class is
    the target at position n − 1.
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
        return self.distance + 1 + self.lead

    def sample(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """X of shape (batch, n, Q) in float64 and labels of shape (batch,), from `generator` only."""
        batch = check_int(batch, "batch")
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
        labels = torch.randint(self.classes, (batch,), generator=generator)
        X = self.noise * torch.randn(batch, self.length, self.classes, generator=generator, dtype=torch.float64)
        X[:, self.lead] = F.one_hot(labels, self.classes).to(torch.float64)
        return X, labels


class _RotationScaling(torch.nn.Module):
    """A = blockdiag(ρ_k R(θ_k)) from unconstrained rows (ν_k, θ_k), ρ_k = sigmoid(ν_k) < 1."""

    def forward(self, radius_angle: torch.Tensor) -> torch.Tensor:
        r, angle = torch.sigmoid(radius_angle[:, 0]), radius_angle[:, 1]
        c, s = r * torch.cos(angle), r * torch.sin(angle)
        return torch.block_diag(*torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2))

    def right_inverse(self, A: torch.Tensor) -> torch.Tensor:
        c, s = A.diagonal()[::2], A.diagonal(-1)[::2]
        r = torch.hypot(c, s)
        return torch.stack([torch.log(r / (1 - r)), torch.atan2(s, c)], 1)


def stable_ssm(classes: int, state_size: int = 16, *, radius: tuple[float, float] = (0.85, 0.95),
               seed: int = 0) -> LinearSSM:
    """A Q → Q LinearSSM (Q = classes) whose A stays stable while it trains: eigenvalues
    ρ_k e^{±iθ_k}, ρ_k < 1.

    Init from a torch.Generator seeded with `seed`: ρ_k uniform in `radius`, θ_k uniform in
    [0, π], B, C Gaussian with variance 1/fan-in. A near-unit init (LRU-style, ρ_k ∈ (0.99,
    0.999)) removes the lag-D attenuation at the start.
    """
    Q, N = check_int(classes, "classes", minimum=2), check_int(state_size, "state_size", minimum=2)
    if N % 2:
        raise ValueError(f"state_size must be even (complex pairs); got {N}")
    lo, hi = (check_real(r, "radius") for r in radius)
    if not 0 < lo <= hi < 1:
        raise ValueError(f"radius must satisfy 0 < lo <= hi < 1; got {radius!r}")
    g = torch.Generator().manual_seed(seed)
    r = lo + (hi - lo) * torch.rand(N // 2, generator=g, dtype=torch.float64)
    angle = math.pi * torch.rand(N // 2, generator=g, dtype=torch.float64)
    B = (1 / math.sqrt(Q)) * torch.randn(N, Q, generator=g, dtype=torch.float64)
    C = (1 / math.sqrt(N)) * torch.randn(Q, N, generator=g, dtype=torch.float64)
    radius_angle = torch.stack([torch.log(r / (1 - r)), angle], 1)
    ssm = LinearSSM(_RotationScaling()(radius_angle), B, C)
    parametrize.register_parametrization(ssm, "_A", _RotationScaling(), unsafe=True)
    with torch.no_grad():
        ssm.parametrizations["_A"].original.copy_(radius_angle)
    return ssm


def recall_model(kind: str, task: RecallTask, *, seed: int = 0,
                 radius: tuple[float, float] = (0.85, 0.95)) -> SequenceMap:
    """A fresh "ssm", "attention" or "hybrid" model for `task`, read at the last position.

    attention: one causal head (d_k = d_v = Q) with zero position biases; hybrid: the residual
    block x + ssm(x), then the attention head without a residual (it would put the last
    background token straight into the logits). `radius` sets the SSM's initial moduli.
    """
    kind = check_choice(kind, "kind", KINDS)
    if not isinstance(task, RecallTask):
        raise TypeError(f"task must be a RecallTask; got {type(task).__name__}")
    if kind == "ssm":
        return stable_ssm(task.classes, radius=radius, seed=seed)
    g = torch.Generator().manual_seed(seed + (kind == "hybrid"))
    Q = task.classes
    W_Q, W_K, W_V, W_O = ((1 / math.sqrt(Q)) * torch.randn(1, Q, Q, generator=g, dtype=torch.float64)
                          for _ in range(4))
    attention = SoftmaxAttention(W_Q, W_K, W_V, W_O, position_bias=torch.zeros(1, task.length, dtype=torch.float64))
    if kind == "attention":
        return attention
    return Stack([Stack([stable_ssm(Q, radius=radius, seed=seed)], residual=True), attention])


def _logits(model: SequenceMap, X: torch.Tensor) -> torch.Tensor:
    with parametrize.cached():  # a parametrised A is formed once per call, not once per step
        return model._forward(X)[:, -1]


@dataclass(frozen=True)
class RecallResult:
    """One training run: test accuracy and mean cross-entropy on the test batch, the mean
    training loss over the last 10 % of steps, and the run's distance, seed, steps and kind."""

    distance: int
    seed: int
    steps: int
    accuracy: float
    loss: float
    train_loss: float
    kind: str = ""


def train_recall(model: SequenceMap, task: RecallTask | int, *, steps: int = 200, seed: int = 0,
                 batch: int = 16, lr: float = 0.02, optimizer: str = "adam", test_size: int = 256,
                 progress: Progress = None, kind: str = "", device: str | torch.device = "cpu") -> RecallResult:
    """Train `model` in place on the task by `fit` (cross-entropy of the last position's logits).

    Batches come from `fit`'s generator seeded with `seed`, the test batch from a second one
    (seed + 1_000_003). optimizer "adam" rescales each step (which hides small gradients);
    "sgd" (momentum 0.9) shows them.
    """
    task = RecallTask(task) if isinstance(task, int) and not isinstance(task, bool) else task
    if not isinstance(task, RecallTask):
        raise TypeError(f"task must be a RecallTask or an int distance; got {type(task).__name__}")
    if not isinstance(model, SequenceMap):
        raise TypeError(f"model must be a lib SequenceMap; got {type(model).__name__}")
    batch, test_size = check_int(batch, "batch"), check_int(test_size, "test_size")
    X_test, y_test = task.sample(test_size, torch.Generator().manual_seed(seed + 1_000_003))

    def draw(generator):
        while True:
            yield task.sample(batch, generator)

    history = fit(model, lambda m, X, y: F.cross_entropy(_logits(m, X), y), draw, steps=steps, lr=lr,
                  optimizer=optimizer, seed=seed, device=device, progress=progress,
                  label=f"recall {kind or type(model).__name__} D={task.distance} seed={seed}")
    with torch.no_grad():
        logits = _logits(model, X_test)
    return RecallResult(distance=task.distance, seed=seed, steps=steps,
                        accuracy=float((logits.argmax(-1) == y_test).to(torch.float64).mean()),
                        loss=float(F.cross_entropy(logits, y_test)),
                        train_loss=float(np.mean(history[-max(1, steps // 10):])), kind=kind)


def initial_gradient_norm(model: SequenceMap, task: RecallTask, *, samples: int = 256, seed: int = 0) -> float:
    """‖∂loss/∂θ‖ over all parameters at their current values: the learning signal before training.

    On a blank background (noise 0) every path of the stable SSM runs through C A^D B, so the
    norm falls like ρ^D; for the attention head the path is α V and it does not.
    """
    if not isinstance(task, RecallTask):
        raise TypeError(f"task must be a RecallTask; got {type(task).__name__}")
    X, y = task.sample(check_int(samples, "samples"), torch.Generator().manual_seed(seed))
    parameters = list(model.parameters())
    flags = [p.requires_grad for p in parameters]
    try:
        model.requires_grad_(True)
        grads = torch.autograd.grad(F.cross_entropy(_logits(model, X), y), parameters, allow_unused=True)
    finally:
        for p, flag in zip(parameters, flags):
            p.requires_grad_(flag)
    return float(torch.sqrt(sum((g ** 2).sum() for g in grads if g is not None)))


def recall_sweep(distances: tuple[int, ...] = (2, 8, 32, 128), kinds: tuple[str, ...] = KINDS,
                 seeds: tuple[int, ...] = (0, 1, 2), *, steps: int = 200, classes: int = 8, noise: float = 0.5,
                 optimizer: str = "adam", lr: float = 0.02, radius: tuple[float, float] = (0.85, 0.95),
                 progress: Progress = None, device: str | torch.device = "cpu") -> list[RecallResult]:
    """Train every (kind, distance, seed) from scratch (model and data seeded by `seed`), in the
    order kinds × distances × seeds."""
    device = check_device(device)
    results = []
    for kind in kinds:
        for D in distances:
            task = RecallTask(D, classes=classes, noise=noise)
            for seed in seeds:
                model = recall_model(kind, task, seed=seed, radius=radius)
                r = train_recall(model, task, steps=steps, seed=seed, optimizer=optimizer, lr=lr, kind=kind,
                                 device=device)
                results.append(r)
                if progress is not None:
                    progress(f"recall {kind:9s} D={D:4d} seed={seed}: accuracy {r.accuracy:.3f}, loss {r.loss:.3f}")
    return results



@dataclass(frozen=True)
class RecallSignal:
    """The learning signal at initialisation of one fresh model (`signal_sweep`)."""

    kind: str
    distance: int
    seed: int
    gradient_norm: float


def signal_sweep(distances: tuple[int, ...] = (2, 8, 32, 128), kinds: tuple[str, ...] = KINDS,
                 seeds: tuple[int, ...] = (0, 1, 2), *, classes: int = 8, samples: int = 256) -> list[RecallSignal]:
    """`initial_gradient_norm` of a fresh `recall_model(kind, task, seed=seed)` on the blank task
    (noise 0, so the class token is the only input), its batch of `samples` drawn with `seed`,
    for every (kind, distance, seed) in the order kinds × distances × seeds."""
    results = []
    for kind in kinds:
        for D in distances:
            task = RecallTask(D, classes=classes, noise=0.0)
            for seed in seeds:
                seed = check_int(seed, "seeds entries", minimum=0)
                norm = initial_gradient_norm(recall_model(kind, task, seed=seed), task, samples=samples, seed=seed)
                results.append(RecallSignal(kind=kind, distance=task.distance, seed=seed, gradient_norm=norm))
    return results

# Former names of the recall models (before they were lib models read by `train_recall`).
def RecallSSM(classes: int, state_size: int = 16, *, radius: tuple[float, float] = (0.85, 0.95),
              seed: int = 0) -> LinearSSM:
    """Former name of `stable_ssm`."""
    return stable_ssm(classes, state_size, radius=radius, seed=seed)


def RecallAttention(classes: int, max_length: int, *, seed: int = 0) -> SoftmaxAttention:
    """Former name of `recall_model("attention", RecallTask(max_length − 1, classes))`."""
    return recall_model("attention", RecallTask(check_int(max_length, "max_length") - 1, classes), seed=seed)


def RecallHybrid(classes: int, max_length: int, state_size: int = 16, *,
                 radius: tuple[float, float] = (0.85, 0.95), seed: int = 0) -> Stack:
    """Former name of `recall_model("hybrid", RecallTask(max_length − 1, classes))` (N = 16 only)."""
    if state_size != 16:
        raise ValueError(f"state_size must be 16 for the recall hybrid; got {state_size}")
    return recall_model("hybrid", RecallTask(check_int(max_length, "max_length") - 1, classes), seed=seed,
                        radius=radius)
