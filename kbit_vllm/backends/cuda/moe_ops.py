"""CUDA implementations of the MoE glue ops (routing, gather, gated activation, combine): argument
marshalling into the C API (csrc/moe_route.cu, moe_gather.cu, moe_gated_act.cu, moe_combine.cu).

One launch each, on torch's current stream, no host sync, outputs allocated here by torch, so a
MoE layer records into a CUDA graph as a handful of kernels. fp32 activations and more experts
than one CTA routes take the reference path.
"""

from __future__ import annotations

import ctypes

import torch

from ... import op_checks as C
from .. import reference as ref
from .cargs import SUFFIX, cint, ptr, stream
from .library import LIB, check, sm_count

ROUTE_MAX_EXPERTS = 1024  # one thread per local expert in the routing CTA
# Above this many (token, k) pairs the routing splits over CTAs of 1024 pairs each (csrc/moe_route.cu):
# one CTA took 212 us for the 65536 pairs of an 8192-token top-8 prefill chunk (H200). Top-8 of 128
# experts, µs one CTA / split: 1024 pairs 4.8 / 5.8, 1536 6.7 / 6.1, 2048 8.3 / 6.2, 4096 14.8 / 6.3.
ROUTE_SPLIT_PAIRS = 1024
# moe_route_gather copies the rows in the routing CTA up to this many bytes of rows; above, moe_gather's
# grid of CTAs copies them. H200 2026-11-26 session 17, bench_moe_layer (Qwen3-30B-A3B shapes, bf16,
# rows of 4 KB, top-8), µs per layer fused / two launches: T=1 (32 KB) 48.6 / 51.5, T=2 (64 KB)
# 59.9 / 58.8.
ROUTE_GATHER_MAX_BYTES = 32 << 10
_ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2}


def moe_route(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
              expert_map: torch.Tensor | None):
    C.check_moe_route(topk_ids, topk_weights, num_experts, expert_map)
    if num_experts > ROUTE_MAX_EXPERTS:
        return ref.moe_route(topk_ids, topk_weights, num_experts, expert_map)
    return _route(topk_ids, topk_weights, num_experts, expert_map, None)


def moe_route_gather(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                     expert_map: torch.Tensor | None, x: torch.Tensor):
    """moe_route, then the rows of x in its order: one launch where the rows are few (decode), else
    moe_route and moe_gather."""
    C.check_moe_route_gather(topk_ids, topk_weights, num_experts, expert_map, x)
    xc = x.contiguous()
    row_bytes = xc.shape[1] * xc.element_size()
    if (num_experts > ROUTE_MAX_EXPERTS or row_bytes % 16 or xc.data_ptr() % 16
            or topk_ids.numel() * row_bytes > ROUTE_GATHER_MAX_BYTES or topk_ids.numel() == 0):
        routed = moe_route(topk_ids, topk_weights, num_experts, expert_map)
        return (*routed, moe_gather(x, routed[0]))
    return _route(topk_ids, topk_weights, num_experts, expert_map, xc)


def _route(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, expert_map: torch.Tensor | None,
           x: torch.Tensor | None):
    """The routing kernel; with x (contiguous, rows of whole 16-byte chunks) it also gathers the rows."""
    dev = topk_ids.device
    ids = topk_ids.contiguous()
    n = ids.numel()
    w = topk_weights.reshape(-1).to(torch.float32).contiguous()
    emap = expert_map.to(torch.int32).contiguous() if expert_map is not None else None
    src_row = torch.empty(n, dtype=torch.int32, device=dev)
    slot = torch.empty(n, dtype=torch.int32, device=dev)
    offsets = torch.empty(num_experts + 1, dtype=torch.int32, device=dev)
    weights = torch.empty(n, dtype=torch.float32, device=dev)
    route_args = (ptr(ids), cint(ids.element_size()), ptr(w), ptr(emap), cint(0 if emap is None else emap.numel()),
                  cint(n), cint(ids.shape[1]), cint(num_experts), ptr(offsets), ptr(src_row), ptr(slot), ptr(weights))
    with torch.cuda.device(dev):
        if x is None:
            counts = None  # per-chunk expert counts of a split routing (every entry written)
            if n > ROUTE_SPLIT_PAIRS:
                counts = torch.empty(int(LIB.kbit_vllm_moe_route_chunks(cint(n))) * num_experts, dtype=torch.int32,
                                     device=dev)
            check(LIB.kbit_vllm_moe_route(*route_args, ptr(counts), stream(dev)), "moe_route")
            return src_row, slot, offsets, weights
        rows = torch.empty((n, x.shape[1]), dtype=x.dtype, device=dev)
        check(LIB.kbit_vllm_moe_route_gather(*route_args, ptr(x), ptr(rows), cint(x.shape[1] * x.element_size() // 16),
                                             cint(x.shape[0]), stream(dev)), "moe_route_gather")
    return src_row, slot, offsets, weights, rows


def moe_gather(x: torch.Tensor, src_row: torch.Tensor) -> torch.Tensor:
    C.check_moe_gather(x, src_row)
    xc = x.contiguous()
    row_bytes = xc.shape[1] * xc.element_size()
    if row_bytes % 16 or xc.data_ptr() % 16:  # the kernel copies 16-byte chunks
        return ref.moe_gather(x, src_row)
    out = torch.empty((src_row.shape[0], xc.shape[1]), dtype=xc.dtype, device=xc.device)
    if out.numel() == 0:
        return out
    with torch.cuda.device(xc.device):
        check(LIB.kbit_vllm_moe_gather(ptr(xc), ptr(src_row.contiguous()), ptr(out), cint(src_row.shape[0]),
                                       cint(row_bytes // 16), cint(xc.shape[0]), stream(xc.device)), "moe_gather")
    return out


def moe_gated_act(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    C.check_moe_gated_act(gate_up, activation)
    if gate_up.dtype not in SUFFIX:
        return ref.moe_gated_act(gate_up, activation)
    gu = gate_up.contiguous()
    rows, inter = gu.shape[0], gu.shape[1] // 2
    out = torch.empty((rows, inter), dtype=gu.dtype, device=gu.device)
    with torch.cuda.device(gu.device):
        check(getattr(LIB, f"kbit_vllm_moe_gated_act_{SUFFIX[gu.dtype]}")(
            ptr(gu), ptr(out), ctypes.c_longlong(rows), cint(inter), cint(_ACT_CODES[activation]),
            cint(sm_count(gu.device)), stream(gu.device)), "moe_gated_act")
    return out


def moe_combine(down: torch.Tensor, slot: torch.Tensor, weights: torch.Tensor, top_k: int) -> torch.Tensor:
    C.check_moe_combine(down, slot, weights, top_k)
    if down.dtype not in SUFFIX:
        return ref.moe_combine(down, slot, weights, top_k)
    d = down.contiguous()
    n_tok, hidden = d.shape[0] // top_k, d.shape[1]
    out = torch.empty((n_tok, hidden), dtype=d.dtype, device=d.device)
    with torch.cuda.device(d.device):
        check(getattr(LIB, f"kbit_vllm_moe_combine_{SUFFIX[d.dtype]}")(
            ptr(d), ptr(slot.contiguous()), ptr(weights.contiguous()), ptr(out), cint(n_tok), cint(hidden), cint(top_k),
            stream(d.device)), "moe_combine")
    return out
