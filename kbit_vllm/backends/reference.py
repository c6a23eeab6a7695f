"""Device-agnostic PyTorch implementations of the kbit_vllm:: ops (the oracle path).

They run on any device torch supports: they serve the CPU, and any op that has no kernel
on a GPU. Pure formats/ math plus torch matmuls; no kernels of our own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import op_checks as C
from ..formats import BLOCK, from_tiled, to_tiled
from ..formats import awq as awq_fmt
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


def moe_route(topk_ids, topk_weights, num_experts, expert_map):
    """Stable sort of the (token, k) pairs by local expert (torch.sort + searchsorted)."""
    C.check_moe_route(topk_ids, topk_weights, num_experts, expert_map)
    top_k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1).to(torch.int64)
    dev = ids.device
    if expert_map is not None:
        n_global = expert_map.shape[0]
        known = (ids >= 0) & (ids < n_global)
        mapped = expert_map.to(torch.int64)[ids.clamp(0, max(n_global - 1, 0))] if n_global else ids
        ids = torch.where(known, mapped, torch.full_like(ids, -1))
    local = (ids >= 0) & (ids < num_experts)
    ids = torch.where(local, ids, torch.full_like(ids, num_experts - 1))
    sorted_ids, order = torch.sort(ids, stable=True)
    offsets = torch.searchsorted(sorted_ids, torch.arange(num_experts + 1, device=dev), out_int32=True)
    slot = torch.empty_like(order).index_copy_(0, order, torch.arange(order.numel(), device=dev))
    weights = torch.where(local, topk_weights.reshape(-1).to(torch.float32), torch.zeros((), device=dev))
    return (order // top_k).to(torch.int32), slot.to(torch.int32), offsets, weights


def moe_gather(x, src_row):
    C.check_moe_gather(x, src_row)
    return x.index_select(0, src_row)


def moe_route_gather(topk_ids, topk_weights, num_experts, expert_map, x):
    C.check_moe_route_gather(topk_ids, topk_weights, num_experts, expert_map, x)
    routed = moe_route(topk_ids, topk_weights, num_experts, expert_map)
    return (*routed, moe_gather(x, routed[0]))


_GATES = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def moe_gated_act(gate_up, activation):
    C.check_moe_gated_act(gate_up, activation)
    inter = gate_up.shape[1] // 2
    return (_GATES[activation](gate_up[:, :inter].to(torch.float32))
            * gate_up[:, inter:].to(torch.float32)).to(gate_up.dtype)


def moe_combine(down, slot, weights, top_k):
    """Sums the top_k pairs of each token in k order, in fp32 (the order the kernel uses)."""
    C.check_moe_combine(down, slot, weights, top_k)
    n_tok = down.shape[0] // top_k
    pairs = down.index_select(0, slot.to(torch.int64)).to(torch.float32).view(n_tok, top_k, down.shape[1])
    w = weights.view(n_tok, top_k, 1)
    acc = torch.zeros((n_tok, down.shape[1]), dtype=torch.float32, device=down.device)
    for k in range(top_k):
        acc += w[:, k] * pairs[:, k]
    return acc.to(down.dtype)


def kbit_moe_experts(x, topk_ids, topk_weights, expert_map, w13_packed, w13_absmax, w2_packed, w2_absmax, codebook,
                     k, activation):
    """The fused MoE op's definition: the five ops it fuses, each through the dispatcher, so on CPU they
    run the CPU implementations (and the CUDA op runs this where its one-kernel path does not apply)."""
    C.check_moe_experts(x, topk_ids, topk_weights, expert_map, w13_packed, w13_absmax, w2_packed, w2_absmax,
                        codebook, k, activation)
    ops = torch.ops.kbit_vllm
    n_exp, inter = w13_absmax.shape[0], w2_absmax.shape[2] * BLOCK
    _, slot, offsets, weights, rows = ops.moe_route_gather(topk_ids, topk_weights, n_exp, expert_map, x)
    gate_up = ops.kbit_grouped_linear(rows, w13_packed, w13_absmax, codebook, offsets, k, 2 * inter)
    down = ops.kbit_grouped_linear(ops.moe_gated_act(gate_up, activation), w2_packed, w2_absmax, codebook, offsets, k,
                                   x.shape[1])
    return ops.moe_combine(down, slot, weights, topk_ids.shape[1])
