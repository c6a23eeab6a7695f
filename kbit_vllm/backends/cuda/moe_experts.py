"""CUDA implementation of kbit_vllm::kbit_moe_experts: a decode-sized MoE layer's routed experts in one
kernel (csrc/kbit_moe_experts.cu), argument marshalling into its C API.

Where the kernel does not apply (more pairs than dispatch.moe_fused takes, deterministic mode, fp32
activations, an intermediate size that is not a multiple of 128, a GPU that cannot hold its shared
memory) the op runs its definition, the five-op composition (backends/reference.py), on the CUDA
kernels of those ops. No host sync: the kernel reads the routing on the device, so the op records
into a CUDA graph.
"""

from __future__ import annotations

import ctypes

import torch

from ... import op_checks as C
from ...formats import BLOCK, TILE_N
from .. import reference as ref
from . import dispatch
from .cargs import SUFFIX, cint, ptr, stream
from .library import LIB, check, sm_count
from .ops import gemv_sk_warps
from .scratch import scratch

_ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2}
MIN_UNITS = 2  # work units per warp at least, for the grid size (the kernel: kMxMinUnitsA / B)
_OCC: dict[tuple[int, int, str], int] = {}


def ctas_per_sm(dev: torch.device, k: int, dtype: torch.dtype) -> int:
    """Resident CTAs per SM of the fused kernel (0: this GPU cannot run it)."""
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), k, SUFFIX[dtype])
    if key not in _OCC:
        with torch.cuda.device(dev):
            _OCC[key] = int(getattr(LIB, f"kbit_vllm_moe_experts_ctas_per_sm_{key[2]}")(cint(k)))
    return _OCC[key]


def fused_usable(x: torch.Tensor, w2_absmax: torch.Tensor, k: int) -> bool:
    """Whether the one-kernel path can run these checked inputs at all (dtype, intermediate size, GPU;
    the hidden size is whole blocks by check_moe_experts)."""
    inter = w2_absmax.shape[2] * BLOCK
    return x.dtype in SUFFIX and inter % TILE_N == 0 and ctas_per_sm(x.device, k, x.dtype) > 0


def kbit_moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                     expert_map: torch.Tensor | None, w13_packed: torch.Tensor, w13_absmax: torch.Tensor,
                     w2_packed: torch.Tensor, w2_absmax: torch.Tensor, codebook: torch.Tensor, k: int,
                     activation: str) -> torch.Tensor:
    args = (x, topk_ids, topk_weights, expert_map, w13_packed, w13_absmax, w2_packed, w2_absmax, codebook, k,
            activation)
    C.check_moe_experts(*args)
    fused = dispatch.moe_fused(topk_ids.numel(), w13_absmax.shape[0]) and fused_usable(x, w2_absmax, k)
    return moe_experts_path(*args, path="fused" if fused else "unfused")


def moe_experts_path(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                     expert_map: torch.Tensor | None, w13_packed: torch.Tensor, w13_absmax: torch.Tensor,
                     w2_packed: torch.Tensor, w2_absmax: torch.Tensor, codebook: torch.Tensor, k: int,
                     activation: str, path: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """kbit_moe_experts through one path: "fused" (the kernel; ValueError where it cannot run) or
    "unfused" (the five ops). Public so tests and benchmarks can run both; out, if given, receives
    the fused result (tests poison it)."""
    if path == "unfused":
        return ref.kbit_moe_experts(x, topk_ids, topk_weights, expert_map, w13_packed, w13_absmax, w2_packed,
                                    w2_absmax, codebook, k, activation)
    if path != "fused":
        raise ValueError(f"kbit_moe_experts: unknown path {path!r} (fused or unfused)")
    if not fused_usable(x, w2_absmax, k):
        raise ValueError(f"kbit_moe_experts: the fused kernel takes fp16/bf16 x and an intermediate size that is a "
                         f"multiple of {TILE_N} on a GPU that holds its shared memory; got x {x.dtype}, intermediate "
                         f"{w2_absmax.shape[2] * BLOCK}, k={k}")
    dev = x.device
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    n_exp, inter = w13_absmax.shape[0], w2_absmax.shape[2] * BLOCK
    y = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    if tokens == 0:
        return y
    pairs = tokens * top_k
    nta, nth = inter // TILE_N, -(-hidden // TILE_N)
    units = pairs * 2 * nta * (hidden // BLOCK) + tokens * nth * top_k * (inter // BLOCK)
    sfx = SUFFIX[x.dtype]
    warps = gemv_sk_warps(k)  # the kernel's CTA shape is the stream-K GEMVs' (SkCfg, csrc/kbit_sk.cuh)
    ctas = max(1, min(ctas_per_sm(dev, k, x.dtype) * sm_count(dev), -(-units // (warps * MIN_UNITS))))
    ids = topk_ids.to(torch.int32).contiguous()
    w = topk_weights.to(torch.float32).contiguous()
    emap = expert_map.to(torch.int32).contiguous() if expert_map is not None else None
    n_acc, n_ctr = ctypes.c_longlong(), ctypes.c_longlong()
    LIB.kbit_vllm_moe_experts_scratch(cint(tokens), cint(top_k), cint(hidden), cint(inter), ctypes.byref(n_acc),
                                      ctypes.byref(n_ctr))
    acc = scratch(dev, "accum", n_acc.value)
    ctr = scratch(dev, "counters", n_ctr.value)
    act = scratch(dev, "partials", (pairs * inter + 1) // 2).view(x.dtype)
    xc = x.contiguous()
    with torch.cuda.device(dev):
        check(getattr(LIB, f"kbit_vllm_moe_experts_{sfx}")(
            ptr(xc), ptr(ids), ptr(w), ptr(emap), cint(0 if emap is None else emap.numel()),
            ptr(w13_packed), ptr(w13_absmax), ptr(w2_packed), ptr(w2_absmax), ptr(codebook), ptr(y), ptr(act),
            ptr(acc), ptr(ctr), cint(k), cint(tokens), cint(top_k), cint(n_exp), cint(hidden), cint(inter),
            cint(_ACT_CODES[activation]), cint(ctas), stream(dev)), "kbit_moe_experts")
    return y
