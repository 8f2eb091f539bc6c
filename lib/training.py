"""The one training loop (`fit`), and students trained to imitate an LTI teacher (`imitate`)."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import check_choice, check_int, check_real
from .attention import RelativeHeads, SoftmaxAttention
from .heads import _check_lti, population_error

HELD_OUT_SEED = 20251217  # one held-out batch for every estimate, independent of training seeds


def _device(device: Any) -> torch.device:
    # "cpu" or an available accelerator ("cuda", "cuda:1", "mps", ...).
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device; got {type(device).__name__}")
    try:
        resolved = torch.device(device)
        available = resolved.type == "cpu" or getattr(torch, resolved.type).is_available()
    except (AttributeError, RuntimeError, ValueError):
        available = False
    if not available:
        raise ValueError(f"device must be 'cpu' or an accelerator available on this machine; got {device!r}")
    return resolved


def fit(model: torch.nn.Module, loss: Callable[..., torch.Tensor],
        batches: Callable[[torch.Generator], Iterable[tuple]], *, steps: int, lr: float,
        final_lr: float | None = None, optimizer: str = "adam", seed: int = 0, device: Any = "cpu",
        progress: Callable[[str], None] | None = None, label: str = "") -> np.ndarray:
    """Train `model`'s parameters in place; return the loss at every step, float64 (steps,) or (steps, R).

    Step t takes the next batch of ``batches(generator)`` (a CPU torch.Generator seeded with
    `seed`, so the data do not depend on the device), evaluates ``loss(model, *batch)`` (a
    scalar, or R independent losses summed for the step) and takes an Adam step (or SGD with
    momentum 0.9), the learning rate decaying geometrically from `lr` to `final_lr`. The model
    trains on `device` and returns to the CPU, also on failure. FloatingPointError names the
    step where the loss stops being finite.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if not callable(loss) or not callable(batches):
        raise TypeError("loss and batches must be callable")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None; got {type(progress).__name__}")
    steps, lr = check_int(steps, "steps"), check_real(lr, "lr", low=0, open_interval=True)
    final = lr if final_lr is None else check_real(final_lr, "final_lr", low=0, open_interval=True)
    optimizer = check_choice(optimizer, "optimizer", ("adam", "sgd"))
    device = _device(device)
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise ValueError("model must have parameters that require grad; got none")
    stream = iter(batches(torch.Generator().manual_seed(check_int(seed, "seed", minimum=0))))
    model.to(device)
    try:
        rule = (torch.optim.Adam(parameters, lr=lr) if optimizer == "adam"
                else torch.optim.SGD(parameters, lr=lr, momentum=0.9))
        schedule = torch.optim.lr_scheduler.ExponentialLR(rule, gamma=(final / lr) ** (1 / max(steps - 1, 1)))
        history = []
        for step in range(steps):
            value = loss(model, *(t.to(device) for t in next(stream)))
            total = value.sum()
            if not torch.isfinite(total):
                raise FloatingPointError(f"training diverged at step {step} (loss {total.item()}); lower lr")
            rule.zero_grad(set_to_none=True)
            total.backward()
            rule.step()
            schedule.step()
            history.append(value.detach())
            if progress is not None and (step + 1) % max(steps // 10, 1) == 0:
                low, high = float(history[-1].min()), float(history[-1].max())
                shown = f"{low:.4g}" if value.numel() == 1 else f"{low:.4g} .. {high:.4g}"
                progress(f"{label or type(model).__name__} step {step + 1}/{steps}: loss {shown}")
    finally:
        model.to("cpu")
    return torch.stack(history).cpu().to(torch.float64).numpy()


def _gaussian_batches(batch: int, n: int, d: int) -> Callable[[torch.Generator], Iterable[tuple]]:
    def draw(generator: torch.Generator):
        while True:
            yield (torch.randn(batch, n, d, generator=generator, dtype=torch.float64),)
    return draw


class _Population(torch.nn.Module):
    """R RelativeHeads students (padded to H_max heads) trained as one module.

    Adam acts elementwise and the step loss is the sum of the students' losses: R independent
    runs on one batch stream. Each student's batch loss is exact through the lags: with
    E_ℓ = L_ℓ − L̂_ℓ and windows u_{b,i} = (x_{i−n+1}, …, x_i), mean_b Σ_i ‖y_i − ŷ_i‖² =
    Σ_a E[a] S E[a]ᵀ with S = mean_b Σ_i u_{b,i} u_{b,i}ᵀ, formed once per step.
    """

    def __init__(self, students: Sequence[RelativeHeads], teacher: Any, n: int) -> None:
        super().__init__()
        R, H_max, p, d = len(students), max(s.H for s in students), teacher.p, teacher.d
        self.V = torch.nn.Parameter(torch.zeros(R, H_max, p, d, dtype=torch.float64))
        self.c = torch.nn.Parameter(torch.zeros(R, H_max, n, dtype=torch.float64))
        self.register_buffer("mask", torch.zeros(R, H_max, 1, dtype=torch.float64))
        with torch.no_grad():
            self.register_buffer("reversed_lags", teacher.lags(n).to(torch.float64).flip(0))  # oldest first
            for r, s in enumerate(students):
                self.V[r, :s.H], self.c[r, :s.H], self.mask[r, :s.H] = s.V, s.coefficients[:, :n], 1.0

    def losses(self, X: torch.Tensor) -> torch.Tensor:
        b, n, d = X.shape
        windows = F.pad(X, (0, 0, n - 1, 0)).unfold(1, n, 1)  # [b, i, e, w] = x_{i+w−(n−1)}
        U = windows.transpose(2, 3).reshape(b * n, n * d)
        S = U.T @ U / b
        E = self.reversed_lags - torch.einsum("rhl,rhpd->rlpd", (self.c * self.mask).flip(-1), self.V)
        E = E.transpose(1, 2).reshape(len(self.V), -1, n * d)
        return ((E @ S) * E).sum((1, 2))


def imitate(students: Sequence[RelativeHeads | SoftmaxAttention], teacher: Any, *, steps: int = 2000,
            batch: int = 32, lr: float = 0.1, final_lr: float = 3e-4, seed: int = 0, held_out: int = 4096,
            progress: Callable[[str], None] | None = None, device: Any = "cpu") -> list[tuple[float, np.ndarray]]:
    """Train students in place to imitate an LTI teacher; (error, loss history (steps,)) for each.

    Each student trains by `fit` on fresh N(0, I) batches of length n = its max_length, with the
    loss mean_b Σ_i ‖y_i − ŷ_i‖² (on the scale of `optimal_head_errors`). RelativeHeads students
    (one n) train together, exactly as each would alone (`_Population`), and report the exact
    `population_error`; a causal SoftmaxAttention with position scores trains alone and reports
    the error on one fixed held-out batch of `held_out` sequences.
    """
    _check_lti(teacher, "teacher")
    if not isinstance(students, Iterable):
        raise TypeError(f"students must be a sequence of models; got {type(students).__name__}")
    students = list(students)
    if not students or not all(isinstance(s, (RelativeHeads, SoftmaxAttention)) and s.max_length for s in students):
        raise TypeError("students must be RelativeHeads or SoftmaxAttention with position scores (max_length)")
    for s in students:
        if (s.d, s.p) != (teacher.d, teacher.p):
            raise ValueError(f"students must have d = {teacher.d}, p = {teacher.p} like the teacher; "
                             f"got d = {s.d}, p = {s.p}")
    batch, held_out = check_int(batch, "batch"), check_int(held_out, "held_out")
    budget = dict(steps=steps, lr=lr, final_lr=final_lr, seed=seed, device=device, progress=progress)
    results: dict[int, tuple[float, np.ndarray]] = {}
    heads = [k for k, s in enumerate(students) if isinstance(s, RelativeHeads)]
    if heads:
        n = students[heads[0]].max_length
        if any(students[k].max_length != n for k in heads):
            raise ValueError("RelativeHeads students must share one length n_max")
        population = _Population([students[k] for k in heads], teacher, n)
        history = fit(population, lambda model, X: model.losses(X), _gaussian_batches(batch, n, teacher.d),
                      label=f"{len(heads)} RelativeHeads", **budget)
        with torch.no_grad():
            for r, k in enumerate(heads):
                students[k].V.copy_(population.V[r, :students[k].H])
                students[k].coefficients.copy_(population.c[r, :students[k].H])
                results[k] = population_error(teacher, students[k], n), history[:, r].copy()
    for k, student in enumerate(students):
        if k in results:
            continue
        n = student.max_length
        with torch.no_grad():
            W = teacher.operator(torch.zeros(n, teacher.d, dtype=teacher.dtype))  # input-independent
        def loss(model, X, W=W):
            return ((model(X) - torch.einsum("ijpd,bjd->bip", W.to(X.device), X)) ** 2).sum((1, 2)).mean()
        history = fit(student, loss, _gaussian_batches(batch, n, teacher.d), label=f"SoftmaxAttention(H={student.H})",
                      **budget)
        X = torch.randn(held_out, n, teacher.d, generator=torch.Generator().manual_seed(HELD_OUT_SEED),
                        dtype=torch.float64)
        with torch.no_grad():
            results[k] = float(((teacher(X) - student(X)) ** 2).sum((1, 2)).mean()), history
    return [results[k] for k in range(len(students))]
