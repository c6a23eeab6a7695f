"""Device-agnostic PyTorch implementations of the kbit_vllm:: ops (the oracle path).

They run on any device torch supports: they serve the CPU, and any op that has no kernel
on a GPU. Pure formats/ math plus torch matmuls; no kernels of our own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import op_checks as C
from ..formats import awq as awq_fmt
from ..formats import from_tiled, to_tiled
from ..formats import kbit as kbit_fmt


def kbit_quantize(weight, codebook, k):
    C.check_quantize(weight, codebook, k)
    return kbit_fmt.quantize_kbit(weight, codebook, k)


def kbit_dequantize(packed, absmax, codebook, k, dtype):
    C.check_serialized(packed, absmax, k, "kbit_dequantize")
    C.check_codebook_for(codebook, k, "kbit_dequantize")
    return kbit_fmt.dequantize_kbit(packed, absmax, codebook, k, dtype)


def kbit_repack(packed, absmax, k):
    C.check_serialized(packed, absmax, k, "kbit_repack")
    return to_tiled(packed, absmax, k)


def kbit_unrepack(packed_tiled, absmax_tiled, k, out_features):
    C.check_tiled(packed_tiled, absmax_tiled, k, out_features, "kbit_unrepack")
    return from_tiled(packed_tiled, absmax_tiled, k, out_features)


def dequantize_tiled(packed_tiled, absmax_tiled, codebook, k, out_features, dtype) -> torch.Tensor:
    packed, absmax = from_tiled(packed_tiled, absmax_tiled, k, out_features)
    return kbit_fmt.dequantize_kbit(packed, absmax, codebook, k, dtype)


def kbit_linear(x, packed_tiled, absmax_tiled, codebook, bias, k, out_features):
    C.check_kbit_linear(x, packed_tiled, absmax_tiled, codebook, bias, k, out_features)
    w = dequantize_tiled(packed_tiled, absmax_tiled, codebook, k, out_features, x.dtype)
    return F.linear(x, w, bias)


def grouped_by_offsets(x: torch.Tensor, expert_offsets: torch.Tensor, out_features: int, op: str,
                       expert_linear) -> torch.Tensor:
    """Run expert_linear(e, rows) on each expert's rows; the host reads the offsets (not for graphs)."""
    offs = [int(v) for v in expert_offsets.tolist()]
    C.require(offs[0] == 0 and offs[-1] == x.shape[0] and all(a <= b for a, b in zip(offs[:-1], offs[1:], strict=True)),
              op, f"expert_offsets must rise from 0 to tokens={x.shape[0]}, got {offs}")
    y = x.new_empty((x.shape[0], out_features))
    for e in range(len(offs) - 1):
        lo, hi = offs[e], offs[e + 1]
        if hi > lo:
            y[lo:hi] = expert_linear(e, x[lo:hi])
    return y


def kbit_grouped_linear(x, packed_tiled, absmax_tiled, codebook, expert_offsets, k, out_features):
    C.check_grouped(x, packed_tiled, absmax_tiled, codebook, expert_offsets, k, out_features)

    def one(e: int, rows: torch.Tensor) -> torch.Tensor:
        w = dequantize_tiled(packed_tiled[e], absmax_tiled[e], codebook, k, out_features, x.dtype)
        return F.linear(rows, w)

    return grouped_by_offsets(x, expert_offsets, out_features, "kbit_grouped_linear", one)


def awq_dequantize(qweight, qzeros, scales, group_size):
    C.check_awq(qweight, qzeros, scales, group_size, "awq_dequantize")
    return awq_fmt.dequantize_awq(qweight, qzeros, scales, group_size)


def awq_scales_and_offsets(qzeros, scales, dtype) -> torch.Tensor:
    """[G, out, 2] (scale, offset) with w = (q - 8) * scale + offset."""
    z = awq_fmt.unpack_awq(qzeros).to(torch.float32)
    s = scales.to(torch.float32)
    return torch.stack([s, (8.0 - z) * s], dim=-1).to(dtype)


def awq_repack(qweight, qzeros, scales, group_size, dtype):
    """Reference resident layout: the AWQ qweight itself, plus scales_and_offsets."""
    C.check_awq(qweight, qzeros, scales, group_size, "awq_repack")
    return qweight.clone(), awq_scales_and_offsets(qzeros, scales, dtype)


def awq_unrepack(wq, in_features, out_features):
    """The reference resident wq is the qweight itself."""
    C.check_awq_unrepack(wq, in_features, out_features)
    C.require(wq.dtype == torch.int32 and tuple(wq.shape) == (in_features, out_features // 8), "awq_unrepack",
              f"wq must be the AWQ qweight int32 [{in_features}, {out_features // 8}] here, got "
              f"{wq.dtype} {list(wq.shape)}")
    return wq.clone()


def awq_linear(x, wq, sz, bias, group_size, out_features):
    """wq is the AWQ qweight int32 [in, out/8] (reference resident layout)."""
    C.check_awq_linear(x, wq, sz, bias, group_size, out_features)
    in_f = sz.shape[0] * group_size
    C.require(wq.dtype == torch.int32 and tuple(wq.shape) == (in_f, out_features // 8), "awq_linear",
              f"wq must be the AWQ qweight int32 [{in_f}, {out_features // 8}] here, got "
              f"{wq.dtype} {list(wq.shape)}")
    q = awq_fmt.unpack_awq(wq).to(torch.float32)  # [in, out]
    g = torch.arange(in_f, device=x.device) // group_size
    s = sz[..., 0].to(torch.float32)[g]
    off = sz[..., 1].to(torch.float32)[g]
    w = ((q - 8.0) * s + off).t().to(x.dtype)
    return F.linear(x, w, bias)


def awq_grouped_linear(x, wq, sz, expert_offsets, group_size, out_features, expert_linear=None):
    """Per-expert awq_linear; expert_linear is the device's awq_linear (default: this reference)."""
    C.check_awq_grouped(x, wq, sz, expert_offsets, group_size, out_features)
    lin = expert_linear or awq_linear
    return grouped_by_offsets(x, expert_offsets, out_features, "awq_grouped_linear",
                              lambda e, rows: lin(rows, wq[e], sz[e], None, group_size, out_features))
