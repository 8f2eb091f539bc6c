"""Stacks of sequence maps: composition, residual connections, Jamba-like hybrids.

Composing layers composes their operators: if Z = f₁(X) with Z = 𝒲¹(X) X and
Y = f₂(Z) with Y = 𝒲²(Z) Z, then Y = 𝒲²(Z) 𝒲¹(X) X, so the stack's operator is the
product of the layers' operators as block matrices in (n·p) space, each evaluated
at its own layer's input:

    𝒲_ij(X) = Σ_k 𝒲²_ik(Z) 𝒲¹_kj(X).

A residual layer y = x + f(x) has operator I + 𝒲^f (identity blocks on the
diagonal).  The Jacobian obeys the same product rule (chain rule) with Jacobian
blocks in place of operator blocks; for LTI layers the two coincide, so a stack of
L stable SSMs has lags that are L-fold convolutions of exponentially decaying lags:
‖J_ij‖ = O((i − j)^{L−1} ρ^{i−j}) ({prf:ref}`prop-stack-decay`).  An attention layer in the
stack can restore a distance-independent path on some inputs ({prf:ref}`prop-attention-highway`).
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

__all__ = ["Stack", "ssm_layer", "SSM_KINDS"]

SSM_KINDS = ("gaussian", "s4d-lin", "s4d-real")


def ssm_layer(kind: str, state_size: int, d: int, spectral_radius: float, *, seed: Any = 0,
              dtype: Any = torch.float64) -> LinearSSM:
    """One d → d LTI SSM layer of the given kind, with ρ(A) = spectral_radius.

    "gaussian": `LinearSSM.random` (Gaussian A rescaled, non-normal: its gradient
    profile can rise before it decays); "s4d-lin" and "s4d-real": `s4d_ssm` with
    init "lin" or "real" (normal A, so ‖A^ℓ‖₂ = ρ^ℓ).  The depth notebook builds
    its pure SSM stacks and its hybrids from this one function, so the two use the
    same kind of layer.

    Args:
        kind: one of SSM_KINDS.
        state_size: N >= 1.
        d: width (input and output).
        spectral_radius: ρ; in (0, 1) for the S4D kinds, >= 0 for "gaussian".
        seed: seed (int or numpy SeedSequence) of the layer's random parameters.
        dtype: computation dtype.
    """
    kind = check_choice(kind, "kind", SSM_KINDS)
    if kind == "gaussian":
        return LinearSSM.random(state_size, d, d, spectral_radius=spectral_radius, seed=seed, dtype=dtype)
    return s4d_ssm(state_size, d, spectral_radius, init=kind.removeprefix("s4d-"), seed=seed, dtype=dtype)


class Stack(SequenceMap):
    """Layers applied one after another, optionally with residual connections.

    Without residual connections Z_k = f_k(Z_{k−1}); with them Z_k = Z_{k−1} + f_k(Z_{k−1});
    Z_0 = X and Y = Z_L.  The operator is the product of the layers' operators at
    their own inputs (see the module docstring), so the identity
    Y = apply_operator(stack.operator(X), X) holds exactly, as for every lib model.

    Args:
        layers: SequenceMaps, at least one, of one dtype, with layers[k].p ==
            layers[k+1].d; with residual connections every layer needs p == d.
        residual: add each layer's input to its output.

    Attributes:
        layers: the layers, a torch ModuleList.
        residual: whether connections are residual.
        causal: True when every layer is causal.
        max_length: the smallest max_length of the layers (None if all unlimited).
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
        """A Jamba-like stack: LTI SSM layers with a SoftmaxAttention layer every `attention_every`.

        Layer k (0-based) is attention when k % attention_every == offset, else an LTI
        SSM built by `ssm_layer(ssm, ...)`; all layers are d → d.  So depth 8 with
        attention_every = 4 and offset 0 has attention at layers 0 and 4 (two of eight),
        not one.  Jamba (Lieber et al. 2024) interleaves one attention layer per 8
        (with Mamba layers and MoE MLPs); here the SSM layers are LTI so their gradient
        paths are exactly C A^ℓ B.  The default offset 0 puts attention first, so
        `planted_key_input(stack.layers[0], ...)` plants a key directly in X.

        Args:
            d: width of every layer.
            depth: number of layers.
            attention_every: period m >= 1 of the attention layers.
            offset: position of attention within each period, 0 <= offset < m.
            state_size: N of the SSM layers.
            heads: heads of the attention layers (SoftmaxAttention.random).
            spectral_radius: ρ(A) of every SSM layer.
            residual: residual connections (default True, as in Jamba).
            causal: causal attention (default True).
            ssm: kind of the SSM layers, see `ssm_layer` ("gaussian", the default for
                backward compatibility, "s4d-lin" or "s4d-real").
            seed: seeds the layers (independent numpy streams per layer).
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
                  if k % every == offset else
                  ssm_layer(ssm, state_size, d, radius, seed=s, dtype=dtype)
                  for k, s in enumerate(seeds)]
        return cls(layers, residual=residual)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        Z = X
        for layer in self.layers:
            out = layer._forward(Z)
            Z = Z + out if self.residual else out
        return Z

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        Z, W = X, None
        for layer in self.layers:
            W_k = layer._operator(Z)
            out = layer._forward(Z)
            if self.residual:
                b, n, p, _ = W_k.shape[0], W_k.shape[1], W_k.shape[3], W_k.shape[4]
                eye = (torch.eye(n, dtype=Z.dtype, device=Z.device)[:, :, None, None]
                       * torch.eye(p, dtype=Z.dtype, device=Z.device))
                W_k, Z = W_k + eye, Z + out
            else:
                Z = out
            # Block-matrix product in (n·p) space: (𝒲ᵏ 𝒲)_ij = Σ_m 𝒲ᵏ_im 𝒲_mj.
            W = W_k if W is None else torch.einsum("bimpq,bmjqd->bijpd", W_k, W)
        return W

    def _sizes(self) -> dict[str, int]:
        return {"depth": len(self.layers), **super()._sizes()}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, residual={self.residual}"
