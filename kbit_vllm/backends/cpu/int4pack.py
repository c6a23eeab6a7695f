"""awq_orin on CPU through aten._weight_int4pack_mm_for_cpu (seed 003's repack).

Resident layout: wq = aten._convert_weight_to_int4pack_for_cpu(q [out, in] int32) (uint8
[out, in/2], opaque tile order) and sz [G, out, 2] = (scale, (8 - zero) * scale). Shapes the
op does not take (out % 16 != 0) keep the AWQ qweight and use dequantize + matmul.
"""

from __future__ import annotations

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
