"""E4M4 absmax encoding: 8-bit float, 4-bit exponent, 4-bit mantissa, bias 11 (seed 001 §1.5).

normal   (e > 0): 2^(e - 11) * (1 + m / 16)
subnormal(e = 0): 2^(-10)   * (m / 16)

Decoding is monotone in the raw byte, so encoding is a search over the midpoints between
consecutive representable values (round to nearest, ties to the larger code). The CUDA
quantize kernel uses the same midpoints, which makes it bit-exact with this reference.
"""

from __future__ import annotations

import torch

E4M4_BIAS = 11
E4M4_MAX = 2.0 ** (15 - E4M4_BIAS) * (1 + 15 / 16)  # 31.0
E4M4_MIN_SUBNORMAL = 2.0 ** (1 - E4M4_BIAS) / 16


def _decode_table() -> torch.Tensor:
    codes = torch.arange(256, dtype=torch.int64)
    e = codes >> 4
    m = (codes & 0xF).to(torch.float64)
    normal = torch.exp2((e - E4M4_BIAS).to(torch.float64)) * (1 + m / 16)
    sub = 2.0 ** (1 - E4M4_BIAS) * (m / 16)
    return torch.where(e > 0, normal, sub).to(torch.float32)


E4M4_TABLE = _decode_table()
# Midpoints between consecutive codes, computed in float64 and rounded to float32 so the
# CUDA kernel can compare against the very same float32 numbers.
E4M4_MIDPOINTS = ((E4M4_TABLE[1:].double() + E4M4_TABLE[:-1].double()) / 2).to(torch.float32)


def decode_e4m4(raw: torch.Tensor) -> torch.Tensor:
    """uint8 E4M4 codes -> float32 values."""
    if raw.dtype != torch.uint8:
        raise ValueError(f"decode_e4m4: expected uint8 codes, got {raw.dtype}")
    return E4M4_TABLE.to(raw.device)[raw.long()]


def encode_e4m4(values: torch.Tensor) -> torch.Tensor:
    """Non-negative float values -> nearest uint8 E4M4 code.

    Values above E4M4_MAX saturate; callers that must not lose data check the range first
    (see formats.kbit.quantize_kbit).
    """
    v = values.to(torch.float32)
    if bool(torch.isnan(v).any()) or bool((v < 0).any()):
        raise ValueError("encode_e4m4: values must be non-negative and not NaN")
    mids = E4M4_MIDPOINTS.to(v.device)
    return torch.searchsorted(mids, v.contiguous(), right=True).to(torch.uint8)
