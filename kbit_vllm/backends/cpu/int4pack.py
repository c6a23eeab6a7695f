"""awq_orin on CPU through aten._weight_int4pack_mm_for_cpu (seed 003's repack).

Resident layout: wq = aten._convert_weight_to_int4pack_for_cpu(q [out, in] int32) (uint8
[out, in/2], opaque tile order) and sz [G, out, 2] = (scale, (8 - zero) * scale). Shapes the
op does not take (out % 16 != 0) keep the AWQ qweight and use dequantize + matmul.
awq_unrepack reads the tile order back by packing probe matrices (see _int4pack_source).
"""

from __future__ import annotations

import functools

import torch

from ... import op_checks as C
from ...formats import awq as awq_fmt
from .. import reference as ref


def available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


def supports(in_features: int, out_features: int, group_size: int) -> bool:
    return available() and out_features % 16 == 0 and in_features % group_size == 0 and in_features % 2 == 0


def resident_shape(in_features: int, out_features: int, group_size: int) -> tuple[tuple[int, int], torch.dtype]:
    if supports(in_features, out_features, group_size):
        return (out_features, in_features // 2), torch.uint8
    return (in_features, out_features // 8), torch.int32


def awq_repack(qweight, qzeros, scales, group_size, dtype):
    C.check_awq(qweight, qzeros, scales, group_size, "awq_repack")
    in_f, out_f = qweight.shape[0], scales.shape[1]
    sz = ref.awq_scales_and_offsets(qzeros, scales, dtype)
    if not supports(in_f, out_f, group_size):
        return qweight.clone(), sz
    q = awq_fmt.unpack_awq(qweight).t().contiguous().to(torch.int32)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), sz


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 bytes -> their nibbles in memory order (low nibble first), uint8."""
    flat = packed.reshape(-1)
    out = torch.empty((flat.numel(), 2), dtype=torch.uint8)
    torch.bitwise_and(flat, 15, out=out[:, 0])
    torch.bitwise_right_shift(flat, 4, out=out[:, 1])
    return out.view(-1)


@functools.lru_cache(maxsize=8)
def _int4pack_source(out_features: int, in_features: int) -> torch.Tensor:
    """For each nibble of the packed [out, in/2] bytes, the flat index (int64) of the q [out, in] value it holds.

    The packing is a nibble permutation whose tile order depends on the CPU's vector width, so it
    is measured, not assumed: pack probe matrices holding the base-16 digits of each position.
    """
    n = out_features * in_features
    idx = torch.arange(n, dtype=torch.int64)
    source = torch.zeros(n, dtype=torch.int64)
    for shift in range(0, max(n - 1, 1).bit_length(), 4):
        digit = ((idx >> shift) & 15).to(torch.int32).view(out_features, in_features)
        source |= _nibbles(torch.ops.aten._convert_weight_to_int4pack_for_cpu(digit, 1)).to(torch.int64) << shift
    seen = torch.zeros(n, dtype=torch.bool)
    seen[source.clamp(0, n - 1)] = True
    if int(source.max()) >= n or not bool(seen.all()):
        raise RuntimeError(f"awq_unrepack: this torch's int4pack layout for [{out_features}, {in_features}] is not "
                           "a nibble permutation; cannot read the weights back")
    return source


def awq_unrepack(wq, in_features, out_features):
    C.check_awq_unrepack(wq, in_features, out_features)
    if wq.dtype != torch.uint8:  # a shape int4pack does not take: wq is the qweight
        return ref.awq_unrepack(wq, in_features, out_features)
    C.require(tuple(wq.shape) == (out_features, in_features // 2), "awq_unrepack",
              f"int4pack wq must be uint8 [{out_features}, {in_features // 2}], got {list(wq.shape)}")
    q = torch.empty(out_features * in_features, dtype=torch.uint8)
    q[_int4pack_source(out_features, in_features)] = _nibbles(wq)
    return awq_fmt.pack_awq(q.view(out_features, in_features).t().contiguous())


def awq_linear(x, wq, sz, bias, group_size, out_features):
    C.check_awq_linear(x, wq, sz, bias, group_size, out_features)
    if wq.dtype != torch.uint8:
        return ref.awq_linear(x, wq, sz, bias, group_size, out_features)
    in_f = sz.shape[0] * group_size
    C.require(tuple(wq.shape) == (out_features, in_f // 2), "awq_linear",
              f"int4pack wq must be uint8 [{out_features}, {in_f // 2}], got {list(wq.shape)}")
    x2 = x.reshape(-1, in_f).contiguous()
    if x2.shape[0] == 0:
        y = x2.new_empty((0, out_features))
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, wq, group_size, sz)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], out_features)


def awq_grouped_linear(x, wq, sz, expert_offsets, group_size, out_features):
    return ref.awq_grouped_linear(x, wq, sz, expert_offsets, group_size, out_features, awq_linear)
