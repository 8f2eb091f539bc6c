"""Stacks of sequence maps: composition and residual connections.

For Z = f₁(X) and Y = f₂(Z), 𝒲_ij(X) = Σ_m 𝒲²_im(Z) 𝒲¹_mj(X): composing layers multiplies
their operators, each at its own layer's input; a residual layer x + f(x) has operator I + 𝒲^f.
"""

from __future__ import annotations

from typing import Iterable

import torch

from .base import SequenceMap, batched


class Stack(SequenceMap):
    """Z_q = f_q(Z_{q−1}), or Z_{q−1} + f_q(Z_{q−1}) if residual; Y = Z_M.

    layers: SequenceMaps of one dtype with layers[k].p == layers[k+1].d (p == d if residual).
    Causal when every layer is; max_length the smallest of the layers'.
    """

    def __init__(self, layers: Iterable[SequenceMap], *, residual: bool = False) -> None:
        super().__init__()
        layers = list(layers) if isinstance(layers, Iterable) else layers
        if not isinstance(layers, list) or not layers or not all(isinstance(f, SequenceMap) for f in layers):
            raise TypeError("layers must be a non-empty sequence of SequenceMaps; got "
                            f"{[type(f).__name__ for f in layers] if isinstance(layers, list) else type(layers).__name__}")
        if not isinstance(residual, bool):
            raise TypeError(f"residual must be a bool; got {type(residual).__name__}")
        for k, layer in enumerate(layers):
            if layer.dtype != layers[0].dtype:
                raise TypeError(f"layers[{k}] must have dtype {layers[0].dtype} like layers[0]; got {layer.dtype}")
            if k and layer.d != layers[k - 1].p:
                raise ValueError(f"layers[{k}] must take d = {layers[k - 1].p} inputs; got d = {layer.d}")
            if residual and layer.p != layer.d:
                raise ValueError(f"layers[{k}] must have p == d in a residual stack; got d = {layer.d}, p = {layer.p}")
        self.layers = torch.nn.ModuleList(layers)
        self.residual = residual
        self.d, self.p = layers[0].d, layers[-1].p
        self.causal = all(layer.causal for layer in layers)
        limits = [layer.max_length for layer in layers if layer.max_length is not None]
        self.max_length = min(limits) if limits else None

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Z = X
        for layer in self.layers:
            Z = Z + layer(Z) if self.residual else layer(Z)
        return Z

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        Z, W = X, None
        for layer in self.layers:
            W_k, out = layer.operator(Z), layer(Z)
            if self.residual:  # + I on the diagonal blocks
                eye_n, eye_p = (torch.eye(k, dtype=Z.dtype, device=Z.device) for k in (W_k.shape[1], W_k.shape[3]))
                W_k, Z = W_k + eye_n[:, :, None, None] * eye_p, Z + out
            else:
                Z = out
            W = W_k if W is None else torch.einsum("bimpq,bmjqd->bijpd", W_k, W)  # (𝒲ᵏ 𝒲)_ij = Σ_m 𝒲ᵏ_im 𝒲_mj
        return W
