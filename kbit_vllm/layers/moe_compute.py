"""Routed-expert MoE math shared by the vLLM FusedMoE methods and the HF experts modules.

One forward for both frameworks: order the (token, k) pairs by expert on the device and gather
their rows (moe_route_gather), run the gate/up grouped GEMM, the gated activation
(moe_gated_act), the down grouped GEMM, then weight each pair by its router weight and sum the
k pairs of each token (moe_combine). On a GPU that is five or six kernels per layer (the routing
CTA copies a decode batch's rows itself; bigger batches take a gather kernel), all ours and
launched with PDL, so each one's launch overlaps the previous one's tail (the torch version of
the glue was ~20, which at decode cost more than the GEMMs). Every step has a static shape
and no host sync (no ``.item()``/``.tolist()``, no ``nonzero``), so the whole function traces
under torch.compile and records into a CUDA graph; only the grouped ops read
``expert_offsets``, and they do it on the device (the CPU reference op may read them on the
host, which is inside the op).

Also the per-expert quantize / repack helpers, so both frameworks stack experts the same way.
Calls only ``kbit_vllm.ops``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops

GroupedLinear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(rows sorted by expert [N, in], expert_offsets int32 [E+1]) -> [N, out]."""
ExpertsOp = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, str], torch.Tensor]
"""(x [T, H], topk_weights [T, K], topk_ids [T, K], expert_map, activation name) -> [T, H]: every step of
moe_forward in one op (kbit_moe_experts), for experts whose two projections share a codebook."""


# transformers' activation modules (by class name: no transformers import here) of the same math.
_HF_ACTS = {"SiLU": "silu", "SiLUActivation": "silu", "GELUActivation": "gelu", "GELUTanh": "gelu_tanh",
            "NewGELUActivation": "gelu_tanh", "PytorchGELUTanh": "gelu_tanh"}


def gated_act_name(act_fn: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """The moe_gated_act name of act_fn when it is one of the fused activations, else None."""
    if act_fn is F.silu:
        return "silu"
    if act_fn is F.gelu:
        return "gelu"
    if isinstance(act_fn, nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(act_fn.approximate)
    return _HF_ACTS.get(type(act_fn).__name__)


def moe_forward(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                w13: GroupedLinear, w2: GroupedLinear, act_fn: Callable[[torch.Tensor], torch.Tensor],
                expert_map: torch.Tensor | None = None, apply_router_weight_on_input: bool = False,
                act_name: str | None = None, experts_op: ExpertsOp | None = None) -> torch.Tensor:
    """sum_k w[t,k] * down_e(act(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t,k]; x [T, H] -> [T, H].

    w13 returns [gate | up] (concatenated halves) per row. Pairs whose (mapped) expert is not
    local contribute nothing (moe_route_gather). act_name (or an act_fn gated_act_name knows) runs the
    fused moe_gated_act; any other act_fn runs as torch ops with the same fp32 math. The k
    outputs of a token are summed in fp32 in k order (moe_combine: deterministic). experts_op,
    where given, runs all of it as one op for a fused activation with the router weights on the
    outputs (on CUDA one kernel for a decode-sized batch: ops.kbit_moe_experts).
    """
    top_k = topk_ids.shape[-1]
    name = act_name or gated_act_name(act_fn)
    if experts_op is not None and name is not None and not apply_router_weight_on_input:
        return experts_op(x, topk_weights.reshape(-1, top_k), topk_ids.reshape(-1, top_k), expert_map, name)
    _, slot, offsets, weights, rows = ops.moe_route_gather(topk_ids.reshape(-1, top_k),
                                                           topk_weights.reshape(-1, top_k), num_experts, expert_map, x)
    if apply_router_weight_on_input:  # vLLM: scale the input rows, then sum outputs unweighted
        per_row = torch.zeros_like(weights).index_copy_(0, slot.to(torch.int64), weights)
        rows = (rows.to(torch.float32) * per_row.unsqueeze(-1)).to(x.dtype)
        weights = (weights != 0).to(torch.float32)  # a zero weight zeroed the row: its output is 0 either way
    gate_up = w13(rows, offsets)
    if name is not None:
        act = ops.moe_gated_act(gate_up, name)
    else:  # in fp32 with one rounding, like the fused op
        inter = gate_up.shape[-1] // 2
        act = (act_fn(gate_up[:, :inter].to(torch.float32)) * gate_up[:, inter:].to(torch.float32)).to(x.dtype)
    return ops.moe_combine(w2(act, offsets), slot, weights, top_k)


def check_expert_dims(layer: str, method: str, hidden: int, inter: int, block: int, inter_desc: str) -> None:
    """Both expert GEMMs reduce over a dim that must split into whole blocks (hidden for gate/up,
    the per-rank intermediate for down); raise naming the layer otherwise."""
    if hidden % block:
        raise ValueError(f"{method}: MoE layer {layer}: hidden_size {hidden} is not a multiple of {block}; "
                         "keep the experts unquantized (modules_to_not_convert)")
    if inter % block:
        raise ValueError(f"{method}: MoE layer {layer}: {inter_desc} {inter} is not a multiple of {block}; "
                         "lower tensor_parallel_size or keep the experts unquantized (modules_to_not_convert)")


def kbit_quantize_experts(w: torch.Tensor, codebook: torch.Tensor, k: int,
                          layer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, out, in] float -> serialized (packed int32 [E, out, in/32*k], absmax uint8 [E, out, in/32]).

    One expert at a time, so the quantizer's temporaries stay at one expert's size.
    """
    if w.dim() != 3:
        raise ValueError(f"kbit: experts {layer}: expected a 3-D [experts, out, in] weight, got {list(w.shape)}")
    n_exp, out_f, in_f = w.shape
    packed = w.new_empty((n_exp, out_f, in_f // 32 * k), dtype=torch.int32)
    absmax = w.new_empty((n_exp, out_f, in_f // 32), dtype=torch.uint8)
    for e in range(n_exp):
        try:
            packed[e], absmax[e] = ops.kbit_quantize(w[e].contiguous(), codebook, k)
        except ValueError as err:
            raise ValueError(f"kbit: cannot quantize expert {e} of {layer}: {err}") from err
    return packed, absmax


def kbit_repack_experts(packed: torch.Tensor, absmax: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Serialized [E, out, ...] -> tiled [E, n_tiles, in/32, k, TILE_N] / [E, n_tiles, in/32, TILE_N]."""
    tiles = [ops.kbit_repack(packed[e].contiguous(), absmax[e].contiguous(), k) for e in range(packed.shape[0])]
    return torch.stack([t[0] for t in tiles]), torch.stack([t[1] for t in tiles])


def kbit_unrepack_experts(packed_t: torch.Tensor, absmax_t: torch.Tensor, k: int,
                          out_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled [E, ...] -> serialized [E, out, in/32*k] / [E, out, in/32] (for saving)."""
    flat = [ops.kbit_unrepack(packed_t[e], absmax_t[e], k, out_features) for e in range(packed_t.shape[0])]
    return torch.stack([f[0] for f in flat]), torch.stack([f[1] for f in flat])


def kbit_grouped(packed_t: torch.Tensor, absmax_t: torch.Tensor, codebook: torch.Tensor, k: int,
                 out_features: int) -> GroupedLinear:
    """A GroupedLinear over one stacked tiled kbit weight."""
    return lambda rows, offsets: ops.kbit_grouped_linear(rows, packed_t, absmax_t, codebook, offsets, k,
                                                         out_features)


def kbit_experts_op(w13_packed: torch.Tensor, w13_absmax: torch.Tensor, w2_packed: torch.Tensor,
                    w2_absmax: torch.Tensor, codebook: torch.Tensor, k: int) -> ExpertsOp:
    """moe_forward's experts_op for stacked tiled kbit experts whose w13 and w2 share `codebook`."""
    def run(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, expert_map: torch.Tensor | None,
            activation: str) -> torch.Tensor:
        return ops.kbit_moe_experts(x, topk_ids, topk_weights, expert_map, w13_packed, w13_absmax, w2_packed,
                                    w2_absmax, codebook, k, activation)
    return run


def check_expert_scales_finite(scales: torch.Tensor, layer: str, proj: str) -> None:
    """AWQ scales [E, G, out] of one projection: raise naming the layer, projection and expert on NaN/Inf."""
    bad = ~torch.isfinite(scales)
    if bool(bad.any()):
        e, *where = bad.nonzero()[0].tolist()
        raise ValueError(f"awq_orin: MoE layer {layer}: checkpoint scales of {proj} (expert {e}) hold NaN or Inf "
                         f"(first at [group, column] {where}); the checkpoint is corrupt")


def awq_repack_experts(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                       dtype: torch.dtype, layer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAWQ tensors stacked over experts [E, ...] -> the stacked resident layout (wq [E, ...], sz [E, G, out, 2])."""
    wqs, szs = [], []
    for e in range(qweight.shape[0]):
        try:
            wq, sz = ops.awq_repack(qweight[e].contiguous(), qzeros[e].contiguous(), scales[e].contiguous(),
                                    group_size, dtype)
        except ValueError as err:
            raise ValueError(f"awq_orin: MoE layer {layer}, expert {e}: {err}") from err
        wqs.append(wq)
        szs.append(sz)
    return torch.stack(wqs), torch.stack(szs)


def awq_unrepack_experts(wq: torch.Tensor, in_features: int, out_features: int) -> torch.Tensor:
    """Stacked resident wq [E, ...] -> AutoAWQ qweight [E, in, out/8] (for saving)."""
    return torch.stack([ops.awq_unrepack(wq[e], in_features, out_features) for e in range(wq.shape[0])])


def awq_grouped(wq: torch.Tensor, sz: torch.Tensor, group_size: int, out_features: int) -> GroupedLinear:
    """A GroupedLinear over one stacked resident AWQ weight (sz follows the activation dtype)."""

    def run(rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        s = sz if sz.dtype == rows.dtype else sz.to(rows.dtype)
        return ops.awq_grouped_linear(rows, wq, s, offsets, group_size, out_features)

    return run
