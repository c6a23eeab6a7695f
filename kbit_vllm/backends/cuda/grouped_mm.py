"""The MoE prefill path shared by kbit and awq_orin: every expert dequantized in one launch (by the
caller), then torch's grouped GEMM over the rows sorted by expert, with the device offsets (no
host sync). The dense ops' large-M rule (dequantize + cuBLAS) for grouped ops."""

from __future__ import annotations

import torch

from . import dispatch


def grouped_mm_ok(dtype: torch.dtype, capability: tuple[int, int], out_features: int) -> bool:
    """Whether torch._grouped_mm serves the call: bf16 on sm_90+ (its CUTLASS kernels), and
    16-byte aligned rows of the output and of the dequantized weights' transpose."""
    return (dtype == torch.bfloat16 and capability >= (9, 0) and out_features % 8 == 0
            and hasattr(torch, "_grouped_mm"))


def prefers_dequant(rows: int, n_exp: int, dtype: torch.dtype, capability: tuple[int, int],
                    out_features: int, wgmma: bool = False, kbit: bool = False) -> bool:
    """Dequantize + grouped GEMM beats the grouped kernel the op would run otherwise (wgmma: the
    Hopper grouped wgmma, kbit's (kbit) or awq_orin's, else the grouped MMA) above
    GROUPED_DEQUANT_MIN_ROWS_WGMMA_KBIT / GROUPED_DEQUANT_MIN_ROWS_WGMMA / GROUPED_DEQUANT_MIN_ROWS
    expected rows per expert, where torch's grouped GEMM takes the call."""
    if wgmma:
        min_rows = dispatch.GROUPED_DEQUANT_MIN_ROWS_WGMMA_KBIT if kbit else dispatch.GROUPED_DEQUANT_MIN_ROWS_WGMMA
    else:
        min_rows = dispatch.GROUPED_DEQUANT_MIN_ROWS
    return (grouped_mm_ok(dtype, capability, out_features)
            and dispatch.grouped_rows_per_expert(rows, n_exp) > min_rows)


def grouped_mm_into(x2: torch.Tensor, w3: torch.Tensor, offsets: torch.Tensor,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """[rows, out] = rows offsets[e]:offsets[e+1] of x2 [rows, in] times w3[e]^T (w3 [E, out, in],
    bf16). offsets int32 [E + 1] on the device, rising from 0 to rows. torch._grouped_mm has no out=
    argument: its result is returned as is, and copied only into a given out (tests poison one);
    at prefill that copy was a second pass over the output (268 MB for 65536 rows of 2048)."""
    if x2.dtype != torch.bfloat16:
        raise ValueError(f"grouped dequant path takes bf16 activations, got {x2.dtype}")
    y = torch._grouped_mm(x2, w3.transpose(-2, -1), offs=offsets[1:])
    return y if out is None else out.copy_(y)
