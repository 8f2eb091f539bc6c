"""Stacks of sequence maps: composition, residual connections, Jamba-like hybrids.

Composing layers multiplies their operators, each at its own layer's input: for Z = f₁(X)
and Y = f₂(Z), 𝒲_ij(X) = Σ_k 𝒲²_ik(Z) 𝒲¹_kj(X); a residual layer x + f(x) has operator
I + 𝒲^f. The Jacobian obeys the same product rule, so a stack of M stable LTI SSMs decays like
(i − j)^{M−1} γ^{i−j} ({prf:ref}`prop-stack-decay`), and one attention layer can reopen a
distance-independent path ({prf:ref}`prop-attention-highway`).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import torch

from ._validation import check_choice, check_int, check_real
from .attention import SoftmaxAttention
from .base import SequenceMap
from .heads import s4d_ssm
from .ssm import LinearSSM

SSM_KINDS = ("gaussian", "s4d-lin", "s4d-real")


def ssm_layer(kind: str, state_size: int, d: int, spectral_radius: float, *, seed: Any = 0,
              dtype: Any = torch.float64) -> LinearSSM:
    """One d → d LTI SSM layer with ρ(A) = spectral_radius, of a kind in SSM_KINDS.

    "gaussian": `LinearSSM.random` (non-normal A: the profile may rise before it decays);
    "s4d-lin", "s4d-real": `s4d_ssm` with that init (normal A, ‖A^ℓ‖₂ = ρ^ℓ; ρ in (0, 1)).
    The depth notebook builds its SSM stacks and hybrids from it. state_size = N; seed, an int
    or numpy SeedSequence.
    """
    kind = check_choice(kind, "kind", SSM_KINDS)
    if kind == "gaussian":
        return LinearSSM.random(state_size, d, d, spectral_radius=spectral_radius, seed=seed, dtype=dtype)
    return s4d_ssm(state_size, d, spectral_radius, init=kind.removeprefix("s4d-"), seed=seed, dtype=dtype)


class Stack(SequenceMap):
    """Layers one after another: Z_q = f_q(Z_{q−1}), or Z_{q−1} + f_q(Z_{q−1}) if residual; Y = Z_M.

    The operator is the product of the layers' operators (module docstring), so
    Y = apply_operator(stack.operator(X), X) as for every model.

    Args: layers, at least one SequenceMap, one dtype, layers[k].p == layers[k+1].d (p == d
    for residual stacks); residual, a bool. Attributes: layers (a ModuleList), residual,
    causal (every layer causal), max_length (the smallest of the layers', None if none).
    """

    def __init__(self, layers: Iterable[SequenceMap], *, residual: bool = False) -> None:
        if isinstance(layers, SequenceMap) or not isinstance(layers, Iterable):
            raise TypeError(f"layers must be a sequence of SequenceMaps; got {type(layers).__name__}")
        if not isinstance(residual, bool):
            raise TypeError(f"residual must be a bool; got {type(residual).__name__}")
        layers = tuple(layers)
        if not layers:
            raise ValueError("layers must contain at least one layer")
        for k, layer in enumerate(layers):
            if not isinstance(layer, SequenceMap):
                raise TypeError(f"layers[{k}] must be a SequenceMap; got {type(layer).__name__}")
            if layer.dtype != layers[0].dtype:
                raise TypeError(f"layers[{k}] must have dtype {layers[0].dtype} like layers[0]; got {layer.dtype}")
            if k and layer.d != layers[k - 1].p:
                raise ValueError(f"layers[{k}] must take d = {layers[k - 1].p} inputs (the p of layers[{k - 1}]); "
                                 f"got d = {layer.d}")
            if residual and layer.p != layer.d:
                raise ValueError(f"layers[{k}] must have p == d for residual connections; got d = {layer.d}, "
                                 f"p = {layer.p}")
        super().__init__(layers[0].dtype, layers[0].d, layers[-1].p)
        self.layers = torch.nn.ModuleList(layers)
        self.residual = residual
        self.causal = all(layer.causal for layer in layers)
        limits = [layer.max_length for layer in layers if layer.max_length is not None]
        self.max_length = min(limits) if limits else None

    @classmethod
    def hybrid(cls, d: int, depth: int, attention_every: int, *, offset: int = 0, state_size: int = 8,
               heads: int = 1, spectral_radius: float = 0.9, residual: bool = True, causal: bool = True,
               ssm: str = "gaussian", seed: Any = 0, dtype: Any = torch.float64) -> "Stack":
        """A Jamba-like d → d stack: layer k is SoftmaxAttention if k % attention_every == offset, else LTI SSM.

        So depth 8, attention_every 4, offset 0 has attention at layers 0 and 4. Jamba (Lieber et
        al. 2024) has one attention layer per 8 among Mamba layers; here the SSM layers are LTI
        (`ssm_layer(ssm, state_size, d, spectral_radius)`), so their paths are exactly C A^ℓ B.
        Attention first (offset 0) lets `planted_key_input(stack.layers[0], ...)` plant a key in X.
        heads, causal: of the attention layers; seed: independent numpy streams per layer.
        """
        d, depth = check_int(d, "d"), check_int(depth, "depth")
        every = check_int(attention_every, "attention_every")
        offset = check_int(offset, "offset", minimum=0)
        if offset >= every:
            raise ValueError(f"offset must satisfy 0 <= offset < attention_every = {every}; got {offset}")
        radius = check_real(spectral_radius, "spectral_radius", nonnegative=True)
        ssm = check_choice(ssm, "ssm", SSM_KINDS)
        seeds = np.random.SeedSequence(seed).spawn(depth)
        layers = [SoftmaxAttention.random(d, d, heads, causal=causal, seed=s, dtype=dtype)
                  if k % every == offset else ssm_layer(ssm, state_size, d, radius, seed=s, dtype=dtype)
                  for k, s in enumerate(seeds)]
        return cls(layers, residual=residual)

    @classmethod
    def lti(cls, d: int, depth: int, *, state_size: int = 8, spectral_radius: float = 0.9, ssm: str = "gaussian",
            residual: bool = False, seed: Any = 0, dtype: Any = torch.float64) -> "Stack":
        """`depth` d → d LTI SSM layers `ssm_layer(ssm, state_size, d, spectral_radius)`, plain or residual.

        The stacks of {prf:ref}`prop-stack-decay`. seed: an int or a list of ints (numpy
        SeedSequence entropy), one independent stream per layer as in `hybrid`; the plain and
        the residual stack of one seed have the same layers.
        """
        d, depth = check_int(d, "d"), check_int(depth, "depth")
        radius = check_real(spectral_radius, "spectral_radius", nonnegative=True)
        ssm = check_choice(ssm, "ssm", SSM_KINDS)
        seeds = np.random.SeedSequence(seed).spawn(depth)
        return cls([ssm_layer(ssm, state_size, d, radius, seed=s, dtype=dtype) for s in seeds], residual=residual)

    @classmethod
    def scalar(cls, constants: Iterable[float], rate: float, *, residual: bool = False) -> "Stack":
        """Scalar LTI layers with lags L^{(q)}_ℓ = κ_q γ^ℓ (A = γ, B = κ_q, C = 1), q = 1..M.

        Every path through them is positive, so they attain the bound of
        {prf:ref}`prop-stack-decay` (`lib.gradients.stack_decay_bound`) with equality.
        constants: M >= 1 numbers κ_q >= 0; rate: γ in [0, 1).
        """
        if isinstance(constants, (str, bytes)) or not isinstance(constants, Iterable):
            raise TypeError(f"constants must be a sequence of numbers; got {type(constants).__name__}")
        constants = [check_real(K, "constants entries", nonnegative=True) for K in constants]
        if not constants:
            raise ValueError("constants must hold at least one number (one per layer)")
        rate = check_real(rate, "rate", nonnegative=True)
        if rate >= 1:
            raise ValueError(f"rate must satisfy 0 <= rate < 1; got {rate}")
        return cls([LinearSSM([[rate]], [[K]], [[1.0]]) for K in constants], residual=residual)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        Z = X
        for layer in self.layers:
            out = layer._forward(Z)
            Z = Z + out if self.residual else out
        return Z

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        Z, W = X, None
        for layer in self.layers:
            W_k, out = layer._operator(Z), layer._forward(Z)
            if self.residual:  # + I: identity blocks on the diagonal
                eye_n, eye_p = (torch.eye(k, dtype=Z.dtype, device=Z.device) for k in (W_k.shape[1], W_k.shape[3]))
                W_k, Z = W_k + eye_n[:, :, None, None] * eye_p, Z + out
            else:
                Z = out
            # Block-matrix product in (n·p) space: (𝒲ᵏ 𝒲)_ij = Σ_m 𝒲ᵏ_im 𝒲_mj.
            W = W_k if W is None else torch.einsum("bimpq,bmjqd->bijpd", W_k, W)
        return W

    def _sizes(self) -> dict[str, int]:
        return {"depth": len(self.layers), **super()._sizes()}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, residual={self.residual}"
