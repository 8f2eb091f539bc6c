"""One training loop for every experiment of the book, and the head-count students.

`fit` trains any torch module — a lib model or a classifier built from them — on seeded
batches, deterministically, on a chosen device, with progress lines for the terminal.
Everything that trains calls it: `train` and `train_factorized` (students imitating an SSM,
{ref}`chap-head-count`), `lib.recall.train_recall` ({ref}`chap-gradient-highway`).

The students are lib models: `FactorizedStudent` is a `RelativeHeads` (learned V_h and
relative-position coefficients, the class of {prf:ref}`thm-head-count`, error in closed form
by `population_error`), `SoftmaxStudent` a causal `SoftmaxAttention` with learned position
biases (error estimated on a fixed held-out batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import check_choice, check_int, check_real
from .attention import SoftmaxAttention
from .factorized import RelativeHeads
from .heads import min_heads, optimal_head_errors, population_error
from .ssm import LinearSSM

_HELD_OUT_SEED = 20251217  # one held-out batch for every estimate, independent of training seeds
Progress = Callable[[str], None] | None


def check_device(device: Any, name: str = "device") -> torch.device:
    """"cpu" or an available accelerator ("cuda", "cuda:1", "mps", ...) as a torch.device.

    TypeError unless a str or torch.device; ValueError if torch cannot parse it, if it is not a
    compute device ("meta"), or if its backend or index is not available on this machine.
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


def fit(model: torch.nn.Module, loss: Callable[..., torch.Tensor],
        batches: Callable[[torch.Generator], Iterable[tuple]], *, steps: int, lr: float,
        final_lr: float | None = None, optimizer: str = "adam", seed: int = 0, device: Any = "cpu",
        progress: Progress = None, label: str = "") -> np.ndarray:
    """Train ``model``'s parameters in place; return the loss at every step.

    Each step takes the next batch from ``batches(generator)`` — a torch.Generator seeded with
    ``seed`` and living on the CPU, so the data do not depend on the device — moves it to
    ``device``, evaluates ``loss(model, *batch)`` (a scalar, or R independent losses that are
    summed for the step), and takes an Adam step (or SGD with momentum 0.9) with a learning
    rate decaying geometrically from ``lr`` to ``final_lr`` (constant if None). The model
    trains on ``device`` and returns to the CPU afterwards, also on failure; parameters are
    trainable during the run and keep their earlier ``requires_grad`` after it.

    Returns:
        float64 array of shape (steps,), or (steps, R) for R losses.

    Raises:
        FloatingPointError: if the loss becomes NaN or infinite (the step is named).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if not callable(loss) or not callable(batches):
        raise TypeError("loss and batches must be callable")
    steps, lr = check_int(steps, "steps"), check_real(lr, "lr", positive=True)
    final = lr if final_lr is None else check_real(final_lr, "final_lr", positive=True)
    optimizer = check_choice(optimizer, "optimizer", ("adam", "sgd"))
    device = check_device(device)
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None; got {type(progress).__name__}")
    parameters = list(model.parameters())
    if not parameters:
        raise ValueError("model must have parameters to train")
    stream = iter(batches(torch.Generator().manual_seed(check_int(seed, "seed", minimum=0))))
    trainable = [p.requires_grad for p in parameters]
    model.to(device).requires_grad_(True)
    try:
        step_rule = (torch.optim.Adam(parameters, lr=lr) if optimizer == "adam"
                     else torch.optim.SGD(parameters, lr=lr, momentum=0.9))
        schedule = torch.optim.lr_scheduler.ExponentialLR(step_rule, gamma=(final / lr) ** (1 / max(steps - 1, 1)))
        history = []
        for step in range(steps):
            value = loss(model, *(t.to(device) for t in next(stream)))
            total = value.sum()
            if not torch.isfinite(total):
                raise FloatingPointError(f"training diverged at step {step} (loss {total.item()}); lower lr")
            step_rule.zero_grad(set_to_none=True)
            total.backward()
            step_rule.step()
            schedule.step()
            value = value.detach()
            history.append(value)
            if progress is not None and (step + 1) % max(steps // 10, 1) == 0:
                low, high = float(value.min()), float(value.max())
                shown = f"{low:.4g}" if value.numel() == 1 else f"{low:.4g} .. {high:.4g}"
                progress(f"{label or type(model).__name__} step {step + 1}/{steps}: loss {shown}")
    finally:
        model.to("cpu")
        for p, flag in zip(parameters, trainable):
            p.requires_grad_(flag)
    return torch.stack(history).cpu().to(torch.float64).numpy()


# -- students imitating an SSM ----------------------------------------------------------


def FactorizedStudent(H: int, n: int, d: int, p: int, *, seed: Any = 0, init_scale: float = 0.1) -> RelativeHeads:
    """An H-head `RelativeHeads` to train: V with iid N(0, 1/d), c with iid N(0, init_scale²)."""
    return RelativeHeads.random(H, check_int(n, "n"), d, p, decay=1.0, scale=init_scale, seed=seed)


def SoftmaxStudent(H: int, n: int, d: int, p: int, *, d_k: int | None = None, d_v: int | None = None,
                   seed: Any = 0) -> SoftmaxAttention:
    """A causal `SoftmaxAttention` to train, with zero position biases (uniform weights at first).

    W_Q, W_K, W_V with iid N(0, 1/d), W_O with N(0, 1/(H d_v)); d_k = d_v = d by default, so
    each V_h can be any p × d map.
    """
    H, n, d, p = (check_int(v, name) for v, name in ((H, "H"), (n, "n"), (d, "d"), (p, "p")))
    d_k = d if d_k is None else check_int(d_k, "d_k")
    d_v = d if d_v is None else check_int(d_v, "d_v")
    rng = np.random.default_rng(seed)
    W_Q, W_K, W_V = (rng.standard_normal((H, k, d)) / math.sqrt(d) for k in (d_k, d_k, d_v))
    W_O = rng.standard_normal((H, p, d_v)) / math.sqrt(H * d_v)
    return SoftmaxAttention(W_Q, W_K, W_V, W_O, causal=True, position_bias=np.zeros((H, n)))


@dataclass(frozen=True)
class TrainResult:
    """error: the final Σ_i E‖y_i − ŷ_i‖² (closed form for RelativeHeads, held-out estimate
    otherwise); history: the training loss at every step, shape (steps,)."""

    error: float
    history: np.ndarray


def _gaussian_batches(batch: int, n: int, d: int) -> Callable[[torch.Generator], Iterable[tuple]]:
    def draw(generator: torch.Generator):
        while True:
            yield (torch.randn(batch, n, d, generator=generator, dtype=torch.float64),)
    return draw


def held_out_error(teacher: Any, model: Any, n: int, samples: int = 4096) -> float:
    """Σ_i E‖y_i − ŷ_i‖² estimated on one fixed batch of `samples` Gaussian sequences of length n.

    Every model is scored on the same inputs; for a residual linear in X the relative standard
    error is at most √(2/samples).
    """
    n, samples = check_int(n, "n"), check_int(samples, "samples")
    generator = torch.Generator().manual_seed(_HELD_OUT_SEED)
    X = torch.randn(samples, n, teacher.d, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        Y, Y_hat = torch.as_tensor(teacher(X)), torch.as_tensor(model(X))
    if Y_hat.shape != Y.shape:
        raise ValueError(f"model must map (b, {n}, {teacher.d}) to {tuple(Y.shape)} like the teacher; "
                         f"got {tuple(Y_hat.shape)}")
    return float(((Y - Y_hat) ** 2).sum((1, 2)).mean())


def _check_students(teacher: Any, students: Sequence[Any]) -> None:
    if not isinstance(teacher, LinearSSM):
        raise TypeError(f"teacher must be a LinearSSM; got {type(teacher).__name__}")
    for student in students:
        if (student.d, student.p) != (teacher.d, teacher.p):
            raise ValueError(f"student must have d = {teacher.d} and p = {teacher.p} like the teacher; "
                             f"got d = {student.d}, p = {student.p}")


def train(student: RelativeHeads | SoftmaxAttention, teacher: LinearSSM, *, steps: int = 2000,
          batch: int = 32, lr: float = 0.1, final_lr: float = 3e-4, seed: int = 0,
          progress: Progress = None, device: Any = "cpu") -> TrainResult:
    """Fit a student to an SSM teacher by `fit` on fresh Gaussian batches (trained in place).

    The loss is mean_b Σ_i ‖y_i − ŷ_i‖², an unbiased estimate of the population error, so it
    is on the scale of `optimal_head_errors`. A RelativeHeads student goes to
    `train_factorized`; a causal SoftmaxAttention student of length n = its max_length is
    trained directly and scored by `held_out_error`.
    """
    if isinstance(student, RelativeHeads):
        return train_factorized([student], teacher, steps=steps, batch=batch, lr=lr, final_lr=final_lr,
                                seed=seed, progress=progress, device=device)[0]
    if not isinstance(student, SoftmaxAttention) or student.max_length is None:
        raise TypeError("student must be a RelativeHeads or a SoftmaxAttention with position_bias; "
                        f"got {type(student).__name__}")
    _check_students(teacher, [student])
    n = student.max_length
    W = teacher._operator(torch.zeros(1, n, teacher.d, dtype=torch.float64))[0].detach()  # LTI: input-independent

    def loss(model, X):
        return ((model._forward(X) - torch.einsum("ijpd,bjd->bip", W.to(X.device), X)) ** 2).sum((1, 2)).mean()

    history = fit(student, loss, _gaussian_batches(check_int(batch, "batch"), n, teacher.d), steps=steps,
                  lr=lr, final_lr=final_lr, seed=seed, device=device, progress=progress,
                  label=f"SoftmaxStudent(H={student.H})")
    return TrainResult(held_out_error(teacher, student, n), history)


class _Population(torch.nn.Module):
    """R RelativeHeads students stacked (padded to H_max heads), trained as one module.

    Adam acts elementwise and the step loss is the sum of the students' losses, so this is R
    independent runs sharing one batch stream. Each student's batch loss is computed exactly
    through the lags: with E_ℓ = L_ℓ − L̂_ℓ and window vectors u_{b,i} = (x_{i−n+1}, …, x_i),
    mean_b Σ_i ‖y_i − ŷ_i‖² = Σ_a E[a] S E[a]ᵀ with S = mean_b Σ_i u_{b,i} u_{b,i}ᵀ, formed once
    per step for all students.
    """

    def __init__(self, students: Sequence[RelativeHeads], teacher: LinearSSM, n: int) -> None:
        super().__init__()
        R, H_max, p, d = len(students), max(s.H for s in students), teacher.p, teacher.d
        self.V = torch.nn.Parameter(torch.zeros(R, H_max, p, d, dtype=torch.float64))
        self.c = torch.nn.Parameter(torch.zeros(R, H_max, n, dtype=torch.float64))
        self.register_buffer("mask", torch.zeros(R, H_max, 1, dtype=torch.float64))
        self.register_buffer("reversed_lags", teacher._lags(n).detach().flip(0))  # windows are oldest-first
        with torch.no_grad():
            for r, s in enumerate(students):
                self.V[r, :s.H], self.c[r, :s.H], self.mask[r, :s.H] = s._V, s._coefficients[:, :n], 1.0

    def losses(self, X: torch.Tensor) -> torch.Tensor:
        b, n, d = X.shape
        windows = F.pad(X, (0, 0, n - 1, 0)).unfold(1, n, 1)  # [b, i, e, w] = x_{i+w−(n−1)}
        U = windows.transpose(2, 3).reshape(b * n, n * d)
        S = U.T @ U / b
        E = self.reversed_lags - torch.einsum("rhl,rhpd->rlpd", (self.c * self.mask).flip(-1), self.V)
        E = E.transpose(1, 2).reshape(len(self.V), -1, n * d)
        return ((E @ S) * E).sum((1, 2))


def train_factorized(students: Sequence[RelativeHeads], teacher: LinearSSM, *, steps: int = 2000,
                     batch: int = 32, lr: float = 0.1, final_lr: float = 3e-4, seed: int = 0,
                     progress: Progress = None, device: Any = "cpu") -> list[TrainResult]:
    """Train several RelativeHeads students (any head counts, one max_length n) at once.

    The same procedure as `train`, vectorised (see `_Population`): a step costs about the
    same for 1 or 100 students, and a student trained here or alone with the same seed follows
    the same trajectory up to rounding. Errors are exact (`population_error`).
    """
    students = list(students)
    if not students or not all(isinstance(s, RelativeHeads) for s in students):
        raise TypeError("students must be a non-empty sequence of RelativeHeads (FactorizedStudent)")
    _check_students(teacher, students)
    n = students[0].max_length
    if any(s.max_length != n for s in students):
        raise ValueError(f"students must share one sequence length n; got {sorted({s.max_length for s in students})}")
    population = _Population(students, teacher, n)
    history = fit(population, lambda model, X: model.losses(X),
                  _gaussian_batches(check_int(batch, "batch"), n, teacher.d), steps=steps, lr=lr,
                  final_lr=final_lr, seed=seed, device=device, progress=progress,
                  label=f"{len(students)} FactorizedStudent(s)")
    with torch.no_grad():
        for r, s in enumerate(students):
            s._V.copy_(population.V[r, :s.H])
            s._coefficients.copy_(population.c[r, :s.H])
    return [TrainResult(population_error(teacher, s, n), history[:, r].copy()) for r, s in enumerate(students)]


# -- the head-count sweep -----------------------------------------------------------------

_MODEL_NAMES = {"factorized": "factorized (trained)", "softmax": "softmax attention (trained)"}


def train_students(teachers: Sequence[LinearSSM], n: int, heads: Sequence[int] | Callable[[int], Iterable[int]],
                   *, model: str = "factorized", seeds: int = 1, steps: int = 2000, batch: int = 32,
                   lr: float = 0.1, final_lr: float = 3e-4, seed: int = 0, progress: Progress = None,
                   device: Any = "cpu") -> list[dict]:
    """Train students with H heads for every teacher and every H; one row per trained student.

    The experiment of {prf:ref}`thm-approx-head-count` on length n: for each teacher (a
    LinearSSM with k = `min_heads(teacher, n)`), students with H in ``heads`` (a sequence, or
    a function k -> head counts) and init seeds ``seed + s``, s < ``seeds``, all trained with
    the batch stream of ``seed`` and one budget (``steps``, ``batch``, ``lr`` → ``final_lr``).
    ``model="factorized"``: `FactorizedStudent`s, all of one teacher trained together by
    `train_factorized` (exact errors); ``"softmax"``: `SoftmaxStudent`s, each by `train`
    (held-out errors).

    Returns:
        rows, teachers × heads × seeds in that order, with keys k, H, model ("factorized
        (trained)" or "softmax attention (trained)"), seed, error (Σ_i E‖y_i − ŷ_i‖²),
        optimum (`optimal_head_errors(teacher, n, ·)[H]`), energy (the same at H = 0) and
        "relative squared error" (error / energy).
    """
    if isinstance(teachers, LinearSSM) or not isinstance(teachers, Iterable):
        raise TypeError(f"teachers must be a sequence of LinearSSM; got {type(teachers).__name__}")
    teachers = list(teachers)
    if not teachers or not all(isinstance(t, LinearSSM) for t in teachers):
        raise TypeError("teachers must be a non-empty sequence of LinearSSM")
    n, seeds = check_int(n, "n"), check_int(seeds, "seeds")
    model = check_choice(model, "model", tuple(_MODEL_NAMES))
    seed = check_int(seed, "seed", minimum=0)
    if not callable(heads) and (isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable)):
        raise TypeError(f"heads must be a sequence of head counts or a function k -> head counts; "
                        f"got {type(heads).__name__}")
    rows = []
    for teacher in teachers:
        k = min_heads(teacher, n)
        if k == 0:
            raise ValueError("teachers must have a non-zero lag on length n (a teacher with k = 0 has no "
                             "output energy to compare with)")
        counts = [check_int(H, "heads[...]") for H in (heads(k) if callable(heads) else heads)]
        if not counts:
            raise ValueError(f"heads must give at least one head count (teacher with k = {k})")
        optimum = optimal_head_errors(teacher, n, max(counts))
        plan = [(H, s) for H in counts for s in range(seeds)]
        if model == "factorized":
            students = [FactorizedStudent(H, n, teacher.d, teacher.p, seed=seed + s) for H, s in plan]
            results = train_factorized(students, teacher, steps=steps, batch=batch, lr=lr, final_lr=final_lr,
                                       seed=seed, progress=progress, device=device)
        else:
            results = [train(SoftmaxStudent(H, n, teacher.d, teacher.p, seed=seed + s), teacher, steps=steps,
                             batch=batch, lr=lr, final_lr=final_lr, seed=seed, progress=progress, device=device)
                       for H, s in plan]
        for (H, s), result in zip(plan, results):
            rows.append({"k": k, "H": H, "model": _MODEL_NAMES[model], "seed": seed + s, "error": result.error,
                         "optimum": float(optimum[H]), "energy": float(optimum[0]),
                         "relative squared error": result.error / float(optimum[0])})
    return rows
