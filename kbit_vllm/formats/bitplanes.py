"""Bit-plane packing: 32 k-bit codes -> k uint32 words, word b holding bit b of each code.

Bit i of word b is bit b of code i (code i is element 32*block + i). Words are stored as
int32 (same bits) because torch has no general uint32 arithmetic.
"""

from __future__ import annotations

import torch

_SHIFTS = torch.arange(32, dtype=torch.int64)


def pack_bitplanes(codes: torch.Tensor, k: int) -> torch.Tensor:
    """codes [..., 32] (integer, values < 2^k) -> int32 [..., k] bit-plane words."""
    if codes.shape[-1] != 32:
        raise ValueError(f"pack_bitplanes: last dim must be 32, got {codes.shape[-1]}")
    c = codes.to(torch.int64)
    shifts = _SHIFTS.to(c.device)
    planes = [(((c >> b) & 1) << shifts).sum(dim=-1) for b in range(k)]
    words = torch.stack(planes, dim=-1)  # values in [0, 2^32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_bitplanes(words: torch.Tensor, k: int) -> torch.Tensor:
    """int32 [..., k] bit-plane words -> uint8 codes [..., 32]."""
    if words.shape[-1] != k:
        raise ValueError(f"unpack_bitplanes: last dim must be k={k}, got {words.shape[-1]}")
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = _SHIFTS.to(w.device)
    codes = torch.zeros(*w.shape[:-1], 32, dtype=torch.int64, device=w.device)
    for b in range(k):
        codes |= ((w[..., b : b + 1] >> shifts) & 1) << b
    return codes.to(torch.uint8)
