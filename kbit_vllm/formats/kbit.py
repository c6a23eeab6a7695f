"""The serialized kbit format: pure tensor math, the oracle for every kernel.

A weight W [out, in] (in % 32 == 0) is cut into blocks of 32 consecutive input channels
of one output row. Per block:
  absmax  uint8 E4M4 code of max |w|            -> absmax [out, in/32]
  codes   nearest codebook entry of w / s, where s = decode_e4m4(absmax) is the scale
          that dequantization will use           -> packed [out, in/32*k] int32 bit planes
Dequantization is codebook[code] * s, computed in float32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .bitplanes import pack_bitplanes, unpack_bitplanes
from .codebook import check_bits
from .e4m4 import E4M4_MAX, decode_e4m4, encode_e4m4

BLOCK = 32


def block_absmax(w: torch.Tensor) -> torch.Tensor:
    """Per-block max |w| in float32, shape [out, in/32]."""
    out_f, in_f = w.shape
    return w.to(torch.float32).reshape(out_f, in_f // BLOCK, BLOCK).abs().amax(dim=-1)


def check_block_absmax(amax: torch.Tensor) -> None:
    """Refuse blocks that are not finite or whose absmax E4M4 cannot represent."""
    if not bool(torch.isfinite(amax).all()):
        r, b = (int(i) for i in (~torch.isfinite(amax)).nonzero()[0])
        raise ValueError(f"quantize_kbit: weight holds NaN or Inf (row {r}, input block {b})")
    too_big = amax > E4M4_MAX
    if bool(too_big.any()):
        r, b = (int(i) for i in too_big.nonzero()[0])
        raise ValueError(
            f"quantize_kbit: block absmax {float(amax[r, b]):.4g} (row {r}, input block {b}) "
            f"exceeds the E4M4 maximum {E4M4_MAX}; keep this layer unquantized "
            "(modules_to_not_convert)"
        )


def nearest_codes(normalized: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Index of the nearest codebook entry (first one on ties), as uint8."""
    dist = (normalized.unsqueeze(-1) - codebook.to(normalized.device)).abs()
    return dist.argmin(dim=-1).to(torch.uint8)


def quantize_kbit(
    w: torch.Tensor, codebook: torch.Tensor, k: int,
    nearest: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nearest_codes,
) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] float -> (packed int32 [out, in/32*k], absmax uint8 [out, in/32]).

    nearest: a drop-in for nearest_codes that must give the same codes (backends/cpu/kbit_encode.py).
    """
    check_bits(k)
    out_f, in_f = w.shape
    amax = block_absmax(w)
    check_block_absmax(amax)
    code = encode_e4m4(amax)
    scale = decode_e4m4(code).unsqueeze(-1)
    blocks = w.to(torch.float32).reshape(out_f, in_f // BLOCK, BLOCK)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    normalized = torch.where(scale > 0, blocks / safe, torch.zeros_like(blocks))
    codes = nearest(normalized, codebook)
    packed = pack_bitplanes(codes, k).reshape(out_f, in_f // BLOCK * k)
    return packed, code


def unpack_codes(packed: torch.Tensor, k: int) -> torch.Tensor:
    """packed int32 [out, in/32*k] -> uint8 codes [out, in]."""
    out_f = packed.shape[0]
    nb = packed.shape[1] // k
    return unpack_bitplanes(packed.reshape(out_f, nb, k), k).reshape(out_f, nb * BLOCK)


def dequantize_kbit(
    packed: torch.Tensor,
    absmax: torch.Tensor,
    codebook: torch.Tensor,
    k: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """(packed, absmax) -> W [out, in] in dtype; values are codebook[code] * scale in fp32."""
    check_bits(k)
    out_f, nb = absmax.shape
    codes = unpack_codes(packed, k).reshape(out_f, nb, BLOCK)
    scale = decode_e4m4(absmax).unsqueeze(-1)
    values = codebook.to(packed.device)[codes.long()] * scale
    return values.reshape(out_f, nb * BLOCK).to(dtype)
