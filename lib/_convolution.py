"""Causal convolution of a sequence with a kernel via the FFT (shared by ssm and factorized)."""

from __future__ import annotations

import torch


def fft_causal_conv(x: torch.Tensor, kernel: torch.Tensor, equation: str) -> torch.Tensor:
    """y[:, t] = Σ_{ℓ=0}^{t} kernel[ℓ] ⋆ x[:, t−ℓ] for t < n, in O(n log n).

    Args:
        x: signal with time on dim 1, shape (b, n, ...).
        kernel: with time on dim 0, shape (m, ...); taps ℓ >= n never act and are dropped.
        equation: einsum combining one frequency of the kernel and of x, with the
            frequency as the kernel's first and x's second index, e.g.
            "fpd,bfd->bfp" for a (p, d) matrix kernel acting on (b, n, d).

    Returns:
        y with time on dim 1, shape given by `equation`.
    """
    n = x.shape[1]
    kernel = kernel[:n]
    # A transform of length >= n + m − 1 makes the circular convolution linear on t < n.
    size = 1 << (n + kernel.shape[0] - 2).bit_length()
    x_hat = torch.fft.rfft(x, n=size, dim=1)
    kernel_hat = torch.fft.rfft(kernel, n=size, dim=0)
    return torch.fft.irfft(torch.einsum(equation, kernel_hat, x_hat), n=size, dim=1)[:, :n]
