"""Bit-plane packing: 32 k-bit codes -> k uint32 words, word b holding bit b of each code.

Bit i of word b is bit b of code i (code i is element 32*block + i). Words are stored as
int32 (same bits) because torch has no general uint32 arithmetic.
"""

from __future__ import annotations

import sys

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
    if sys.byteorder != "little":  # the byte view below assumes byte j = bits 8j..8j+7
        w = words.to(torch.int64) & 0xFFFFFFFF
        shifts = _SHIFTS.to(w.device)
        codes = torch.zeros(*w.shape[:-1], 32, dtype=torch.int64, device=w.device)
        for b in range(k):
            codes |= ((w[..., b : b + 1] >> shifts) & 1) << b
        return codes.to(torch.uint8)
    # Each byte of a word -> its 8 bits through a 256-entry table (one gather), then OR the planes:
    # ~8x faster on CPU than shifting every word 32 times in int64.
    by = words.contiguous().view(torch.uint8).reshape(*words.shape, 4)
    bits = _byte_bits(words.device).index_select(0, by.reshape(-1).long()).reshape(*words.shape[:-1], k, 32)
    codes = bits[..., 0, :].clone()
    for b in range(1, k):
        codes |= bits[..., b, :] << b
    return codes


_BYTE_BITS: dict[torch.device, torch.Tensor] = {}


def _byte_bits(device: torch.device) -> torch.Tensor:
    """[256, 8] uint8: bit i of byte value v."""
    if device not in _BYTE_BITS:
        v = torch.arange(256, dtype=torch.int64)
        _BYTE_BITS[device] = ((v[:, None] >> torch.arange(8)) & 1).to(torch.uint8).to(device)
    return _BYTE_BITS[device]
