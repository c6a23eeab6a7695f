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
    if sys.byteorder != "little" or codes.device.type != "cpu":
        # The byte views below assume byte j = bits 8j..8j+7; uint64 multiplication is a CPU op.
        return pack_bitplanes_shifts(codes, k)
    # Bit b of each code as one byte (0 or 1); each run of 8 such bytes, read as a uint64 and
    # multiplied by _GATHER, has bit i of byte i at bit 56 + i of the product's top byte (every
    # other partial product lands elsewhere, no two at one place, so nothing carries into it;
    # unsigned, so the ones past bit 63 wrap away): the plane's byte. ~10x faster on CPU than
    # shifting every code 32 times in int64.
    lead = codes.shape[:-1]
    c = codes.reshape(-1, 32).to(torch.uint8)
    planes = torch.empty((c.shape[0], k, 4), dtype=torch.uint8)
    bits = torch.empty_like(c)
    gather = torch.tensor(_GATHER, dtype=torch.uint64)
    for b in range(k):
        torch.bitwise_right_shift(c, b, out=bits)
        bits.bitwise_and_(1)
        planes[:, b] = (bits.view(torch.uint64) * gather).view(torch.uint8).view(-1, 4, 8)[..., 7]
    return planes.view(torch.int32).view(*lead, k)


_GATHER = 0x0102040810204080  # sum of 2^(56 - 7i): byte i's bit 0 -> bit 56 + i


def pack_bitplanes_shifts(codes: torch.Tensor, k: int) -> torch.Tensor:
    """pack_bitplanes by its definition (bit b of code i -> bit i of word b), with int64 shifts:
    for big-endian hosts and non-CPU tensors, and the test of the fast path."""
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
