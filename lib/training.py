"""Training multi-head students to imitate an SSM teacher, for the head-count experiments.

Two students, both H-head members of the factorized class ({prf:ref}`def-factorized`):

- `FactorizedStudent`: learned V_h and relative-position coefficients c[h, ℓ]
  (signed, unnormalised) — the model class of {prf:ref}`thm-head-count`; its
  error has the closed form of `lib.heads.population_error`, and no H-head
  student can go below `optimal_head_errors(teacher, n, H)[H]`
  ({prf:ref}`thm-approx-head-count`);
- `SoftmaxStudent`: causal softmax attention with learned relative-position score
  biases — positive, row-normalised, input-dependent coefficients; its error is
  estimated on a fixed held-out batch.

`train` fits either one with Adam on fresh Gaussian batches; `train_factorized`
fits many factorized students at once (a step costs about the same for 1 or 100
of them).  Everything is seeded with explicit generators (no global random
state); progress lines go to an optional callback.

Measured on the book's shared 2-core machine (one thread, p = d = 3, n = 32): a
factorized step ≈ 2 ms for 1 to 24 students, so the defaults (2000 steps of 32
sequences) take ≈ 4–5 s per call; a softmax step ≈ 4–11 ms (800 steps of 16
sequences ≈ 3.5–9 s per student for 1–8 heads).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import check_int, check_real
from .attention import SoftmaxAttention
from .base import SequenceMap
from .factorized import RelativeHeads
from .heads import population_error
from .ssm import LinearSSM

__all__ = ["FactorizedStudent", "SoftmaxStudent", "TrainResult", "train", "train_factorized", "held_out_error"]

_HELD_OUT_SEED = 20251217  # one fixed held-out batch for every estimate, independent of training seeds


def _gaussian_tokens(samples: int, n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(samples, n, d, generator=generator, dtype=torch.float64)


def check_device(device: Any, name: str = "device") -> torch.device:
    """A torch device this machine can compute on: "cpu", or an available accelerator ("cuda", "cuda:1", "mps", ...).

    Raises TypeError unless `device` is a str or torch.device, and ValueError if
    torch does not parse it, if it is not a compute device (e.g. "meta"), or if its
    backend is unavailable here (e.g. "cuda" on a machine without a CUDA GPU).
    """
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name} must be a str or torch.device; got {type(device).__name__}")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"{name} must be a torch device such as 'cpu' or 'cuda'; got {device!r} ({error})") from None
    if resolved.type == "cpu":
        return torch.device("cpu")
    backend = getattr(torch, resolved.type, None)  # torch.cuda, torch.mps, torch.xpu, ...
    if not callable(getattr(backend, "is_available", None)):
        raise ValueError(f"{name} must be 'cpu' or an accelerator with a torch backend (cuda, mps, xpu, ...); "
                         f"got {device!r}")
    if not backend.is_available():
        raise ValueError(f"{name} {device!r} is not available on this machine "
                         f"(torch.{resolved.type}.is_available() is False); use device='cpu'")
    count = getattr(backend, "device_count", None)
    if resolved.index is not None and callable(count) and resolved.index >= count():
        raise ValueError(f"{name} {device!r} does not exist: this machine has {count()} {resolved.type} device(s)")
    current = getattr(backend, "current_device", None)
    if resolved.index is None and callable(current):
        resolved = torch.device(resolved.type, current())  # "cuda" means the current CUDA device
    return resolved


def _is_on(tensor: torch.Tensor, device: torch.device) -> bool:
    return tensor.device.type == device.type and device.index in (None, tensor.device.index)


def _on_device(model: Any, device: torch.device) -> Any:
    # `model` with its tensors on `device`, the original untouched: a lib SequenceMap is copied
    # shallowly with its tensors (and sub-models) moved, an nn.Module deep-copied and moved;
    # other callables are returned as they are.  Nothing is copied when nothing has to move.
    if isinstance(model, torch.nn.Module):
        tensors = [*model.parameters(), *model.buffers()]
        return model if all(_is_on(t, device) for t in tensors) else copy.deepcopy(model).to(device)
    if not isinstance(model, SequenceMap):
        return model
    moved = {}
    for key, value in vars(model).items():
        if isinstance(value, torch.Tensor) and not _is_on(value, device):
            moved[key] = value.to(device)
        elif isinstance(value, SequenceMap):
            inner = _on_device(value, device)
            if inner is not value:
                moved[key] = inner
        elif isinstance(value, tuple) and value and all(isinstance(v, SequenceMap) for v in value):
            inner = tuple(_on_device(v, device) for v in value)
            if any(a is not b for a, b in zip(inner, value)):
                moved[key] = inner
    if not moved:
        return model
    clone = copy.copy(model)
    vars(clone).update(moved)
    return clone


def _sizes(H: int, n: int, d: int, p: int) -> tuple[int, int, int, int]:
    return check_int(H, "H"), check_int(n, "n"), check_int(d, "d"), check_int(p, "p")


class FactorizedStudent(torch.nn.Module):
    """A trainable H-head relative-position model: ŷ_i = Σ_h Σ_{ℓ≤i} c[h, ℓ] V_h x_{i−ℓ}.

    The trainable form of `RelativeHeads` ({prf:ref}`def-factorized` with
    α^h_ij = c[h, i−j]).  Its lags are L̂_ℓ = Σ_h c[h, ℓ] V_h, so against an LTI
    teacher its population error under tokens iid N(0, I) is exactly
    Σ_ℓ (n−ℓ) ‖L_ℓ − L̂_ℓ‖²_F (`population_error`).

    Initialisation: V with iid N(0, 1/d) entries, c with iid N(0, init_scale²).

    Args:
        H: number of heads.
        n: sequence length (coefficients for lags 0..n−1).
        d: input width.  p: output width.
        seed: seed of the initialisation (numpy default_rng).
        init_scale: standard deviation of the initial coefficients.
    """

    def __init__(self, H: int, n: int, d: int, p: int, *, seed: Any = 0, init_scale: float = 0.1) -> None:
        super().__init__()
        H, n, d, p = _sizes(H, n, d, p)
        init_scale = check_real(init_scale, "init_scale", nonnegative=True)
        rng = np.random.default_rng(seed)
        self.V = torch.nn.Parameter(torch.tensor(rng.standard_normal((H, p, d)) / math.sqrt(d)))
        self.c = torch.nn.Parameter(torch.tensor(init_scale * rng.standard_normal((H, n))))
        self.H, self.n, self.d, self.p = H, n, d, p

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """ŷ = student(X) for X of shape (b, n', d), n' ≤ n; differentiable in V and c."""
        return RelativeHeads(self.V, self.c)(X)

    def to_model(self) -> RelativeHeads:
        """The current student as a RelativeHeads (an independent copy), H heads, max length n."""
        return RelativeHeads(self.V.detach().clone(), self.c.detach().clone())

    def population_error(self, teacher: LinearSSM | RelativeHeads, *, device: str | torch.device = "cpu") -> float:
        """Σ_i E‖y_i − ŷ_i‖² on length-n Gaussian sequences, exactly: Σ_ℓ (n−ℓ)‖L_ℓ − L̂_ℓ‖²_F.

        Args:
            teacher: a LinearSSM or RelativeHeads with the student's d and p.
            device: accepted (and checked as in `train`) for a uniform interface; the
                closed form is a float64 numpy sum over n lags, so it is evaluated on
                the host whatever the device and the result never depends on it.
                Tested on CPU only in this book's CI.
        """
        check_device(device)
        return population_error(teacher, self.to_model(), self.n)

    def extra_repr(self) -> str:
        return f"H={self.H}, n={self.n}, d={self.d}, p={self.p}"


class SoftmaxStudent(torch.nn.Module):
    """A trainable causal softmax attention with relative-position score biases.

    Per head h: s^h_ij = (W_Q^h x_i)·(W_K^h x_j)/√d_k + b[h, i−j] for j ≤ i,
    α^h_ij = softmax_j(s^h_ij), ŷ_i = Σ_h W_O^h W_V^h Σ_j α^h_ij x_j — the forward
    pass of `SoftmaxAttention` with these tensors as parameters.  The weights are
    positive and sum to 1 over j ≤ i, so unlike `FactorizedStudent` it cannot
    produce signed, unnormalised lag coefficients — in particular every row of
    its operator sums to the same map, Σ_j 𝒲_ij(X) = Σ_h V_h for all i and X,
    while an SSM's row sums Σ_{ℓ≤i} L_ℓ change with i ({prf:ref}`prop-softmax-obstruction`).
    Being input-dependent, its error has no closed form and is estimated by
    `held_out_error`.

    Initialisation: W_Q, W_K, W_V with iid N(0, 1/d) entries, W_O with
    N(0, 1/(H d_v)), b = 0 (uniform attention over the past).

    Args:
        H: number of heads.
        n: longest sequence length (biases for lags 0..n−1).
        d: input width.  p: output width.
        d_k: query/key width (default d).  d_v: value width (default d, so each
            V_h = W_O^h W_V^h can be any p × d map, like FactorizedStudent's).
        seed: seed of the initialisation (numpy default_rng).
    """

    def __init__(self, H: int, n: int, d: int, p: int, *, d_k: int | None = None, d_v: int | None = None,
                 seed: Any = 0) -> None:
        super().__init__()
        H, n, d, p = _sizes(H, n, d, p)
        d_k = d if d_k is None else check_int(d_k, "d_k")
        d_v = d if d_v is None else check_int(d_v, "d_v")
        rng = np.random.default_rng(seed)

        def parameter(shape: tuple[int, ...], std: float) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.tensor(std * rng.standard_normal(shape)))

        self.W_Q = parameter((H, d_k, d), 1 / math.sqrt(d))
        self.W_K = parameter((H, d_k, d), 1 / math.sqrt(d))
        self.W_V = parameter((H, d_v, d), 1 / math.sqrt(d))
        self.W_O = parameter((H, p, d_v), 1 / math.sqrt(H * d_v))
        self.bias = torch.nn.Parameter(torch.zeros(H, n, dtype=torch.float64))
        self.H, self.n, self.d, self.p = H, n, d, p

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """ŷ = student(X) for X of shape (b, n', d), n' ≤ n; differentiable in all parameters."""
        return self._attention(self.W_Q, self.W_K, self.W_V, self.W_O, self.bias)(X)

    @staticmethod
    def _attention(*tensors: torch.Tensor) -> SoftmaxAttention:
        W_Q, W_K, W_V, W_O, bias = tensors
        return SoftmaxAttention(W_Q, W_K, W_V, W_O, causal=True, position_bias=bias)

    def to_model(self) -> SoftmaxAttention:
        """The current student as a SoftmaxAttention (an independent copy) with position_bias."""
        tensors = (self.W_Q, self.W_K, self.W_V, self.W_O, self.bias)
        return self._attention(*(t.detach().clone() for t in tensors))

    def population_error(self, teacher: Any, samples: int = 4096, *, device: str | torch.device = "cpu") -> float:
        """Σ_i E‖y_i − ŷ_i‖² on length-n Gaussian sequences, estimated by `held_out_error`.

        Args:
            teacher: a sequence map with the student's d and p (e.g. a LinearSSM).
            samples: number of held-out sequences.
            device: where the estimate is computed, as in `held_out_error`.
                Tested on CPU only in this book's CI.
        """
        return held_out_error(teacher, self.to_model(), self.n, samples, device=device)

    def extra_repr(self) -> str:
        return f"H={self.H}, n={self.n}, d={self.d}, p={self.p}"


def held_out_error(teacher: Any, model: Any, n: int, samples: int = 4096, *,
                   device: str | torch.device = "cpu") -> float:
    """Monte Carlo estimate of Σ_i E‖y_i − ŷ_i‖² on a fixed batch of Gaussian sequences.

    The batch (`samples` sequences of length n, tokens iid N(0, I_d)) is drawn from
    a generator with a fixed seed, so every model is scored on the same inputs.
    When the residual is linear in X (e.g. an LTI model against an SSM) the
    relative standard error is at most √(2/samples) (2.2 % for 4096 samples).

    Args:
        teacher, model: sequence maps (anything callable on a (b, n, d) tensor) with equal d, p.
        n: sequence length.
        samples: number of held-out sequences.
        device: torch device of the computation ("cpu", "cuda", "cuda:1", ...).  The
            batch is drawn on the CPU (so it does not depend on the device) and moved
            there; lib sequence maps and nn.Modules are evaluated on copies whose
            tensors live there (the originals stay put), other callables must accept
            tensors on `device`.  ValueError if the device is unknown or unavailable.
            Tested on CPU only in this book's CI.

    Returns:
        The mean over the batch of Σ_i ‖y_i − ŷ_i‖².
    """
    n, samples = check_int(n, "n"), check_int(samples, "samples")
    device = check_device(device)
    X = _gaussian_tokens(samples, n, teacher.d, torch.Generator().manual_seed(_HELD_OUT_SEED)).to(device)
    teacher, model = _on_device(teacher, device), _on_device(model, device)
    with torch.no_grad():
        Y, Y_hat = torch.as_tensor(teacher(X), device=device), torch.as_tensor(model(X), device=device)
    if Y_hat.shape != Y.shape:
        raise ValueError(f"model must map (b, {n}, {teacher.d}) to {tuple(Y.shape)} like the teacher; "
                         f"got {tuple(Y_hat.shape)}")
    return float(((Y - Y_hat) ** 2).sum((1, 2)).mean())


@dataclass(frozen=True)
class TrainResult:
    """The outcome of training one student.

    Attributes:
        error: the student's final population error Σ_i E‖y_i − ŷ_i‖² (closed
            form for FactorizedStudent, held-out estimate for SoftmaxStudent).
        history: training loss at every step (mean over the batch of
            Σ_i ‖y_i − ŷ_i‖²), shape (steps,).
    """

    error: float
    history: np.ndarray


def _check_training(teacher: Any, students: list, steps: Any, batch: Any, lr: Any, final_lr: Any,
                    progress: Any) -> tuple[int, int, float, float]:
    if not isinstance(teacher, LinearSSM):
        raise TypeError(f"teacher must be a LinearSSM; got {type(teacher).__name__}")
    for student in students:
        if (student.d, student.p) != (teacher.d, teacher.p):
            raise ValueError(f"student must have d = {teacher.d} and p = {teacher.p} like the teacher; "
                             f"got d = {student.d}, p = {student.p}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None; got {type(progress).__name__}")
    return (check_int(steps, "steps"), check_int(batch, "batch"), check_real(lr, "lr", positive=True),
            check_real(final_lr, "final_lr", positive=True))


def _optimizer(parameters: list[torch.Tensor], steps: int, lr: float, final_lr: float):
    # Adam with a geometric decay from lr to final_lr at the last step.
    optimizer = torch.optim.Adam(parameters, lr=lr)
    gamma = (final_lr / lr) ** (1 / max(steps - 1, 1))
    return optimizer, torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=gamma)


def _report(progress: Callable[[str], None] | None, step: int, steps: int, what: str, losses: torch.Tensor) -> None:
    if progress is not None and (step + 1) % max(steps // 10, 1) == 0:
        low, high = float(losses.min()), float(losses.max())
        spread = f"{low:.4g}" if len(losses) == 1 else f"{low:.4g} .. {high:.4g}"
        progress(f"{what} step {step + 1}/{steps}: loss {spread}")


def train(student: FactorizedStudent | SoftmaxStudent, teacher: LinearSSM, *, steps: int = 2000,
          batch: int = 32, lr: float = 0.1, final_lr: float = 3e-4, seed: int = 0,
          progress: Callable[[str], None] | None = None, device: str | torch.device = "cpu") -> TrainResult:
    """Fit a student to an SSM teacher with Adam on fresh Gaussian batches.

    Each step draws X with tokens iid N(0, I_d) of length student.n and
    minimises the batch loss mean_b Σ_i ‖y_i − ŷ_i‖² with y = teacher(X) — an
    unbiased estimate of the population error, so the loss is on the scale of
    `optimal_head_errors`.  The learning rate decays geometrically from `lr` to
    `final_lr`; the small final rate averages out the batch noise, so the final
    error sits close to the best the student reaches.  A FactorizedStudent is
    trained by `train_factorized` (see there for how its loss is computed).

    Deterministic: the batches come from a torch.Generator seeded with `seed`
    (the student's initialisation has its own seed); the student is trained in place.
    With `device` the batches are still drawn on the CPU and then moved, so the
    random stream does not depend on the device (the results may, by rounding).

    Args:
        student: a FactorizedStudent or SoftmaxStudent with the teacher's d and p.
        teacher: a LinearSSM.
        steps: number of Adam steps.  batch: sequences per step.
        lr: initial learning rate.  final_lr: learning rate at the last step.
        seed: seed of the batch generator.
        progress: called with a one-line status about ten times per run (e.g. print).
        device: torch device of the computation ("cpu", "cuda", "cuda:1", ...).  The
            student's parameters live there during training and are moved back to
            the CPU at the end (also if training fails), so the student, its
            `to_model()` and the result are CPU objects.  ValueError if the device is
            unknown or its backend unavailable.  Tested on CPU only in this book's CI.

    Returns:
        TrainResult(error, history) with history of shape (steps,).
    """
    if isinstance(student, FactorizedStudent):
        return train_factorized([student], teacher, steps=steps, batch=batch, lr=lr, final_lr=final_lr,
                                seed=seed, progress=progress, device=device)[0]
    if not isinstance(student, SoftmaxStudent):
        raise TypeError(f"student must be a FactorizedStudent or SoftmaxStudent; got {type(student).__name__}")
    steps, batch, lr, final_lr = _check_training(teacher, [student], steps, batch, lr, final_lr, progress)
    device = check_device(device)
    generator = torch.Generator().manual_seed(check_int(seed, "seed", minimum=0))
    # The teacher is LTI: its outputs are one einsum with its input-independent operator.
    W = torch.as_tensor(teacher.operator(np.zeros((student.n, teacher.d))), dtype=torch.float64, device=device)
    history = torch.empty(steps, dtype=torch.float64, device=device)
    student.to(device)  # in place (the Parameter objects are kept); moved back below
    try:
        optimizer, schedule = _optimizer(list(student.parameters()), steps, lr, final_lr)
        for step in range(steps):
            X = _gaussian_tokens(batch, student.n, student.d, generator).to(device)
            loss = ((student(X) - torch.einsum("ijpd,bjd->bip", W, X)) ** 2).sum((1, 2)).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            history[step] = loss.detach()
            _report(progress, step, steps, f"SoftmaxStudent(H={student.H})", history[step:step + 1])
    finally:
        student.to("cpu")
    return TrainResult(error=student.population_error(teacher, device=device), history=history.cpu().numpy())


def train_factorized(students: Sequence[FactorizedStudent], teacher: LinearSSM, *, steps: int = 2000,
                     batch: int = 32, lr: float = 0.1, final_lr: float = 3e-4, seed: int = 0,
                     progress: Callable[[str], None] | None = None,
                     device: str | torch.device = "cpu") -> list[TrainResult]:
    """Train several FactorizedStudents (any head counts) on the same batches, all at once.

    Same procedure as `train`, vectorised over students: Adam acts elementwise
    and the total loss is the sum of the students' losses, so this is R
    independent runs that share the batch stream of `seed` (a student trained
    here or alone with the same seed follows the same trajectory, up to rounding).

    The batch loss is computed exactly, but through the lags: a student's output
    is the causal convolution ŷ_i = Σ_ℓ L̂_ℓ x_{i−ℓ} with L̂_ℓ = Σ_h c[h, ℓ] V_h
    (the same map as its forward pass), so with D_ℓ = L_ℓ − L̂_ℓ and the window
    vectors u_{b,i} = (x_i, x_{i−1}, …, x_{i−n+1}) ∈ ℝ^{nd} (zeros before the start),

        mean_b Σ_i ‖y_i − ŷ_i‖² = Σ_a D[a] S D[a]ᵀ,   S = mean_b Σ_i u_{b,i} u_{b,i}ᵀ,

    where D[a] ∈ ℝ^{nd} stacks row a of D_0..D_{n−1}.  S is formed once per step
    for all students, which makes a step cost about the same for 1 or 100 students.

    Args:
        students: FactorizedStudents with the teacher's d and p and a common n (trained in place).
        teacher: a LinearSSM.
        steps, batch, lr, final_lr, seed, progress: as in `train`.
        device: torch device of the computation, as in `train`: the stacked
            parameters, the teacher's lags and the batches (drawn on the CPU from the
            seeded generator, then moved) live there; the trained values are copied
            back into the students' CPU parameters.  Tested on CPU only in this book's CI.

    Returns:
        One TrainResult per student, in order.
    """
    students = list(students)
    if not students or not all(isinstance(s, FactorizedStudent) for s in students):
        raise TypeError("students must be a non-empty sequence of FactorizedStudent")
    steps, batch, lr, final_lr = _check_training(teacher, students, steps, batch, lr, final_lr, progress)
    n, d, p = students[0].n, teacher.d, teacher.p
    if any(s.n != n for s in students):
        raise ValueError(f"students must share one sequence length n; got {sorted({s.n for s in students})}")
    device = check_device(device)
    R, H_max = len(students), max(s.H for s in students)
    # Stack the students, padding to H_max heads; padded heads are masked out and get zero gradient.
    V = torch.zeros(R, H_max, p, d, dtype=torch.float64, device=device)
    c = torch.zeros(R, H_max, n, dtype=torch.float64, device=device)
    mask = torch.zeros(R, H_max, 1, dtype=torch.float64, device=device)
    for r, s in enumerate(students):
        V[r, :s.H], c[r, :s.H], mask[r, :s.H] = s.V.detach(), s.c.detach(), 1.0
    V.requires_grad_(True)
    c.requires_grad_(True)
    # Window vectors are formed oldest-first (no flip), so lags are used in reversed order.
    reversed_lags = torch.as_tensor(teacher.lags(n), dtype=torch.float64, device=device).flip(0)
    generator = torch.Generator().manual_seed(check_int(seed, "seed", minimum=0))
    optimizer, schedule = _optimizer([V, c], steps, lr, final_lr)
    history = torch.empty(steps, R, dtype=torch.float64, device=device)
    for step in range(steps):
        X = _gaussian_tokens(batch, n, d, generator).to(device)
        S = _window_gram(X)
        D = reversed_lags - torch.einsum("rhl,rhpd->rlpd", (c * mask).flip(-1), V)
        D = D.transpose(1, 2).reshape(R, p, n * d)
        losses = ((D @ S) * D).sum((1, 2))
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        optimizer.step()
        schedule.step()
        history[step] = losses.detach()
        _report(progress, step, steps, f"{R} FactorizedStudent(s)", history[step])
    with torch.no_grad():
        for r, s in enumerate(students):
            s.V.copy_(V[r, :s.H])  # into the students' own (CPU) parameters
            s.c.copy_(c[r, :s.H])
    history = history.cpu()
    return [TrainResult(error=s.population_error(teacher, device=device), history=history[:, r].numpy().copy())
            for r, s in enumerate(students)]


def _window_gram(X: torch.Tensor) -> torch.Tensor:
    # S = mean_b Σ_i u_{b,i} u_{b,i}ᵀ, shape (nd, nd), with the window oldest-first:
    # u_{b,i}[w d + e] = X[b, i − ℓ, e] for ℓ = n − 1 − w (0 for i < ℓ).
    b, n, d = X.shape
    windows = F.pad(X, (0, 0, n - 1, 0)).unfold(1, n, 1)  # [b, i, e, w] = x_{i+w−(n−1)}
    U = windows.transpose(2, 3).reshape(b * n, n * d)
    return U.T @ U / b
