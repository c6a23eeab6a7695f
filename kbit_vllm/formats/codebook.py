"""Normal-float codebooks for k-bit blockwise quantization (seed 001 §1.2, §8.1).

A codebook holds 2^k float32 reconstruction levels. The default places the levels at
the expected values of N(0, 1) inside 2^k equiprobable bins and scales them so that
max |level| == 1, which makes the block absmax the natural scale.
"""

from __future__ import annotations

import torch

SUPPORTED_BITS = (2, 3, 4, 5)

_CACHE: dict[tuple[int, str], torch.Tensor] = {}


def check_bits(k: int, where: str = "kbit") -> None:
    """Raise a ValueError unless k is one of the supported bit widths."""
    if not isinstance(k, int) or isinstance(k, bool) or k not in SUPPORTED_BITS:
        raise ValueError(f"{where}: bits must be one of {SUPPORTED_BITS}, got {k!r}")


def _normal_float_levels(k: int) -> torch.Tensor:
    """Conditional means of N(0,1) over 2^k equiprobable bins, in float64."""
    n = 1 << k
    probs = torch.arange(n + 1, dtype=torch.float64) / n
    edges = torch.special.ndtri(probs)  # -inf .. +inf
    pdf = torch.exp(-0.5 * edges.square()) / (2.0 * torch.pi) ** 0.5
    pdf = torch.nan_to_num(pdf, nan=0.0)  # exp(-inf) is 0; guard the infinities anyway
    levels = (pdf[:-1] - pdf[1:]) * n  # E[X | edge_i < X < edge_i+1]
    return levels / levels.abs().max()


def normal_float_codebook(k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Sorted float32 codebook of 2^k levels with max |level| == 1, cached per (k, device).

    The cached tensor is shared: treat it as read-only.
    """
    check_bits(k)
    dev = torch.device(device)
    key = (k, str(dev))
    cb = _CACHE.get(key)
    if cb is None:
        cb = _normal_float_levels(k).to(torch.float32).to(dev)
        _CACHE[key] = cb
    return cb


def check_codebook(codebook: torch.Tensor, k: int, where: str = "kbit") -> None:
    """Validate a (possibly user-supplied) codebook for bit width k."""
    check_bits(k, where)
    if not isinstance(codebook, torch.Tensor):
        raise TypeError(f"{where}: codebook must be a torch.Tensor, got {type(codebook).__name__}")
    if codebook.dtype != torch.float32:
        raise ValueError(f"{where}: codebook must be float32, got {codebook.dtype}")
    if codebook.dim() != 1 or codebook.numel() != (1 << k):
        raise ValueError(
            f"{where}: codebook for bits={k} must have shape [{1 << k}], got {list(codebook.shape)}"
        )
