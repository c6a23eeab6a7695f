"""AutoAWQ "gemm" int4 format: pure tensor math (seed 000 §3.2, seed 003).

qweight int32 [in, out/8]: each int32 holds 8 consecutive outputs of one input channel.
Nibble slot s (bits 4s..4s+3) holds output 8*c + AWQ_ORDER[s]; so output j of a pack sits
at slot AWQ_REVERSE_ORDER[j].
qzeros  int32 [groups, out/8], same nibble order.
scales  [groups, out], fp16 or bf16.
w[i, o] = scales[g, o] * (q[i, o] - z[g, o]) with g = i // group_size.
"""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
AWQ_GROUP_SIZES = (32, 64, 128)
PACK = 8


def unpack_awq(q: torch.Tensor) -> torch.Tensor:
    """int32 [rows, cols/8] in AWQ nibble order -> uint8 nibbles [rows, cols]."""
    rows, packs = q.shape
    qi = q.to(torch.int64) & 0xFFFFFFFF
    out = torch.empty(rows, packs, PACK, dtype=torch.uint8, device=q.device)
    for slot, col in enumerate(AWQ_ORDER):
        out[:, :, col] = ((qi >> (4 * slot)) & 0xF).to(torch.uint8)
    return out.reshape(rows, packs * PACK)


def pack_awq(nibbles: torch.Tensor) -> torch.Tensor:
    """uint8/int nibbles [rows, cols] (cols % 8 == 0, values 0..15) -> int32 [rows, cols/8]."""
    rows, cols = nibbles.shape
    n = nibbles.to(torch.int64).reshape(rows, cols // PACK, PACK)
    word = torch.zeros(rows, cols // PACK, dtype=torch.int64, device=nibbles.device)
    for slot, col in enumerate(AWQ_ORDER):
        word |= (n[:, :, col] & 0xF) << (4 * slot)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def dequantize_awq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """AWQ tensors -> dense weight [out, in] (nn.Linear orientation), in dtype (default scales')."""
    q = unpack_awq(qweight).to(torch.float32)  # [in, out]
    z = unpack_awq(qzeros).to(torch.float32)  # [G, out]
    s = scales.to(torch.float32)
    g = torch.arange(q.shape[0], device=q.device) // group_size
    w = (q - z[g]) * s[g]
    return w.t().contiguous().to(dtype or scales.dtype)


def quantize_awq_rtn(
    w: torch.Tensor, group_size: int = 128, scale_dtype: torch.dtype = torch.float16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric int4 of W [out, in] into AWQ tensors (qweight, qzeros, scales).

    No activation-aware search: this is the plain RTN baseline, packed exactly as AutoAWQ
    packs its checkpoints, so any AWQ loader reads it.
    """
    out_f, in_f = w.shape
    wg = w.to(torch.float32).t().reshape(in_f // group_size, group_size, out_f)
    wmax = wg.amax(dim=1).clamp(min=0)
    wmin = wg.amin(dim=1).clamp(max=0)
    scale = ((wmax - wmin) / 15).clamp(min=1e-5).to(scale_dtype)
    s = scale.to(torch.float32)
    zero = (-wmin / s).round().clamp(0, 15)
    q = ((wg / s.unsqueeze(1)).round() + zero.unsqueeze(1)).clamp(0, 15)
    qweight = pack_awq(q.reshape(in_f, out_f).to(torch.uint8))
    qzeros = pack_awq(zero.to(torch.uint8))
    return qweight, qzeros, scale


def awq_to_int4_affine(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AWQ -> (nibbles [out, in] int32, scales [G, out], offsets [G, out]) with
    w = (q - 8) * scale + offset, the affine form of PyTorch's int4pack ops (seed 003)."""
    q = unpack_awq(qweight).t().contiguous().to(torch.int32)
    z = unpack_awq(qzeros).to(torch.float32)
    s32 = scales.to(torch.float32)
    offset = ((8.0 - z) * s32).to(scales.dtype)
    return q, scales, offset
