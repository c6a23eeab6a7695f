"""Input validation shared by every op's fake and real implementations.

Each check raises ValueError (or TypeError) naming the op and what was expected, so a bad
shape never reaches a kernel and nothing is silently computed wrong.
"""

from __future__ import annotations

import torch

from .formats import AWQ_GROUP_SIZES, BLOCK, TILE_N, check_bits, n_tiles_for

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def require(cond: bool, op: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"kbit_vllm::{op}: {msg}")


def _dtype(t: torch.Tensor, want: torch.dtype | tuple[torch.dtype, ...], op: str, name: str) -> None:
    wants = want if isinstance(want, tuple) else (want,)
    names = ", ".join(str(w) for w in wants[:-1]) + (" or " if len(wants) > 1 else "") + str(wants[-1])
    require(t.dtype in wants, op, f"{name} must be {names}, got {t.dtype}")


def _same_device(op: str, **tensors: torch.Tensor | None) -> None:
    devs = {n: t.device for n, t in tensors.items() if t is not None}
    first = next(iter(devs.values()))
    for n, d in devs.items():
        require(d == first, op, f"all tensors must be on one device; {n} is on {d}, expected {first}")


def check_codebook_for(codebook: torch.Tensor, k: int, op: str) -> None:
    try:
        check_bits(k, f"kbit_vllm::{op}")
    except ValueError as e:
        raise ValueError(str(e)) from None
    _dtype(codebook, torch.float32, op, "codebook")
    require(
        codebook.dim() == 1 and codebook.numel() == (1 << k),
        op,
        f"codebook for bits={k} must have shape [{1 << k}], got {list(codebook.shape)}",
    )


def check_quantize(w: torch.Tensor, codebook: torch.Tensor, k: int) -> None:
    op = "kbit_quantize"
    check_codebook_for(codebook, k, op)
    _dtype(w, FLOAT_DTYPES, op, "weight")
    require(w.dim() == 2, op, f"weight must be 2-D [out, in], got shape {list(w.shape)}")
    require(w.shape[1] % BLOCK == 0, op, f"in_features must be a multiple of {BLOCK}, got {w.shape[1]}")
    _same_device(op, weight=w, codebook=codebook)


def check_serialized(packed: torch.Tensor, absmax: torch.Tensor, k: int, op: str) -> None:
    check_bits(k, f"kbit_vllm::{op}")
    _dtype(packed, torch.int32, op, "packed")
    _dtype(absmax, torch.uint8, op, "absmax")
    require(absmax.dim() == 2, op, f"absmax must be 2-D [out, in/32], got {list(absmax.shape)}")
    out_f, nb = absmax.shape
    require(
        packed.dim() == 2 and tuple(packed.shape) == (out_f, nb * k),
        op,
        f"packed must be [out, in/32*k] = [{out_f}, {nb * k}] for bits={k} and absmax "
        f"{list(absmax.shape)}, got {list(packed.shape)}",
    )
    _same_device(op, packed=packed, absmax=absmax)


def check_tiled(packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor, k: int, out_features: int, op: str,
                experts: bool = False) -> None:
    """Tiled layout: packed [(E,) n_tiles, in/32, k, TILE_N] int32, absmax [(E,) n_tiles, in/32, TILE_N]."""
    check_bits(k, f"kbit_vllm::{op}")
    _dtype(packed_tiled, torch.int32, op, "packed_tiled")
    _dtype(absmax_tiled, torch.uint8, op, "absmax_tiled")
    lead = 1 if experts else 0
    require(out_features > 0, op, f"out_features must be positive, got {out_features}")
    nt = n_tiles_for(out_features)
    require(
        absmax_tiled.dim() == 3 + lead and absmax_tiled.shape[lead] == nt and absmax_tiled.shape[-1] == TILE_N,
        op,
        f"absmax_tiled must be [{'E, ' if experts else ''}{nt}, in/32, {TILE_N}] for out_features="
        f"{out_features}, got {list(absmax_tiled.shape)}",
    )
    expect = (*absmax_tiled.shape[:-1], k, TILE_N)
    require(
        tuple(packed_tiled.shape) == expect,
        op,
        f"packed_tiled must be {list(expect)} for bits={k}, got {list(packed_tiled.shape)}",
    )
    _same_device(op, packed_tiled=packed_tiled, absmax_tiled=absmax_tiled)


def check_kbit_linear(x: torch.Tensor, packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor,
                      codebook: torch.Tensor, bias: torch.Tensor | None, k: int, out_features: int,
                      op: str = "kbit_linear", experts: bool = False) -> None:
    check_codebook_for(codebook, k, op)
    check_tiled(packed_tiled, absmax_tiled, k, out_features, op, experts)
    _dtype(x, FLOAT_DTYPES, op, "x")
    in_f = absmax_tiled.shape[-2] * BLOCK
    require(x.dim() >= 1 and x.shape[-1] == in_f, op,
            f"x must be [..., {in_f}] to match the weight's in_features, got {list(x.shape)}")
    if bias is not None:
        require(bias.dtype == x.dtype, op, f"bias dtype {bias.dtype} must match x dtype {x.dtype}")
        require(tuple(bias.shape) == (out_features,), op,
                f"bias must be [{out_features}], got {list(bias.shape)}")
    _same_device(op, x=x, packed_tiled=packed_tiled, codebook=codebook, bias=bias)


def check_grouped(x: torch.Tensor, packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor,
                  codebook: torch.Tensor, expert_offsets: torch.Tensor, k: int, out_features: int) -> None:
    op = "kbit_grouped_linear"
    check_kbit_linear(x, packed_tiled, absmax_tiled, codebook, None, k, out_features, op, experts=True)
    check_expert_offsets(x, expert_offsets, packed_tiled.shape[0], op)


def check_expert_offsets(x: torch.Tensor, expert_offsets: torch.Tensor, n_exp: int, op: str) -> None:
    require(x.dim() == 2, op, f"x must be 2-D [tokens, in] sorted by expert, got {list(x.shape)}")
    _dtype(expert_offsets, (torch.int32, torch.int64), op, "expert_offsets")
    require(tuple(expert_offsets.shape) == (n_exp + 1,), op,
            f"expert_offsets must be [num_experts + 1] = [{n_exp + 1}], got {list(expert_offsets.shape)}")
    _same_device(op, x=x, expert_offsets=expert_offsets)


def check_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
              op: str) -> None:
    require(group_size in AWQ_GROUP_SIZES, op, f"group_size must be one of {AWQ_GROUP_SIZES}, got {group_size}")
    _dtype(qweight, torch.int32, op, "qweight")
    _dtype(qzeros, torch.int32, op, "qzeros")
    _dtype(scales, (torch.float16, torch.bfloat16, torch.float32), op, "scales")
    require(qweight.dim() == 2, op, f"qweight must be 2-D [in, out/8], got {list(qweight.shape)}")
    in_f, out8 = qweight.shape
    require(in_f % group_size == 0, op, f"in_features {in_f} must be a multiple of group_size {group_size}")
    groups = in_f // group_size
    require(tuple(scales.shape) == (groups, out8 * 8), op,
            f"scales must be [in/group_size, out] = [{groups}, {out8 * 8}], got {list(scales.shape)}")
    require(tuple(qzeros.shape) == (groups, out8), op,
            f"qzeros must be [in/group_size, out/8] = [{groups}, {out8}], got {list(qzeros.shape)}")
    _same_device(op, qweight=qweight, qzeros=qzeros, scales=scales)


def check_awq_unrepack(wq: torch.Tensor, in_features: int, out_features: int, op: str = "awq_unrepack") -> None:
    require(in_features > 0 and out_features > 0 and out_features % 8 == 0, op,
            f"needs in_features > 0 and out_features a positive multiple of 8, got [{in_features}, {out_features}]")
    _dtype(wq, (torch.int32, torch.uint8), op, "wq")
    require(wq.dim() == 2, op, f"wq must be 2-D (one layer's awq_repack output), got {list(wq.shape)}")


def check_awq_linear(x: torch.Tensor, wq: torch.Tensor, sz: torch.Tensor, bias: torch.Tensor | None,
                     group_size: int, out_features: int, op: str = "awq_linear") -> None:
    """Resident AWQ layout: sz is [in/group_size, out, 2] (scale, offset) in x's dtype."""
    require(group_size in AWQ_GROUP_SIZES, op, f"group_size must be one of {AWQ_GROUP_SIZES}, got {group_size}")
    _dtype(x, FLOAT_DTYPES, op, "x")
    require(sz.dim() == 3 and sz.shape[1] == out_features and sz.shape[2] == 2, op,
            f"scales_and_offsets must be [in/group_size, {out_features}, 2], got {list(sz.shape)}")
    require(sz.dtype == x.dtype, op, f"scales_and_offsets dtype {sz.dtype} must match x dtype {x.dtype} "
            "(repack with the activation dtype)")
    in_features = sz.shape[0] * group_size
    require(x.dim() >= 1 and x.shape[-1] == in_features, op,
            f"x must be [..., {in_features}], got {list(x.shape)}")
    if bias is not None:
        require(bias.dtype == x.dtype, op, f"bias dtype {bias.dtype} must match x dtype {x.dtype}")
        require(tuple(bias.shape) == (out_features,), op, f"bias must be [{out_features}], got {list(bias.shape)}")
    _same_device(op, x=x, wq=wq, sz=sz, bias=bias)


def check_awq_grouped(x: torch.Tensor, wq: torch.Tensor, sz: torch.Tensor, expert_offsets: torch.Tensor,
                      group_size: int, out_features: int) -> None:
    """Stacked resident AWQ layout: wq [E, ...], sz [E, in/group_size, out, 2]."""
    op = "awq_grouped_linear"
    require(sz.dim() == 4, op, f"scales_and_offsets must be [E, in/group_size, {out_features}, 2], "
            f"got {list(sz.shape)}")
    require(wq.dim() == 3 and wq.shape[0] == sz.shape[0], op,
            f"wq must be [E={sz.shape[0]}, ...] (awq_repack per expert, stacked), got {list(wq.shape)}")
    check_awq_linear(x, wq[0], sz[0], None, group_size, out_features, op)
    check_expert_offsets(x, expert_offsets, sz.shape[0], op)


MOE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
"""Gated activations moe_gated_act computes: act(gate) * up (gelu: erf form; gelu_tanh: tanh form)."""


def check_moe_route(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                    expert_map: torch.Tensor | None, op: str = "moe_route") -> None:
    _same_device(op, topk_ids=topk_ids, topk_weights=topk_weights, expert_map=expert_map)
    require(topk_ids.dim() == 2, op, f"topk_ids must be [tokens, top_k], got {list(topk_ids.shape)}")
    require(topk_ids.shape[1] >= 1, op, f"top_k must be >= 1, got topk_ids {list(topk_ids.shape)}")
    _dtype(topk_ids, (torch.int32, torch.int64), op, "topk_ids")
    require(tuple(topk_weights.shape) == tuple(topk_ids.shape), op,
            f"topk_weights must match topk_ids {list(topk_ids.shape)}, got {list(topk_weights.shape)}")
    _dtype(topk_weights, FLOAT_DTYPES, op, "topk_weights")
    require(num_experts >= 1, op, f"num_experts must be >= 1, got {num_experts}")
    if expert_map is not None:
        require(expert_map.dim() == 1, op, f"expert_map must be 1-D [global experts], got {list(expert_map.shape)}")
        _dtype(expert_map, (torch.int32, torch.int64), op, "expert_map")


def check_moe_gated_act(gate_up: torch.Tensor, activation: str) -> None:
    op = "moe_gated_act"
    require(activation in MOE_ACTIVATIONS, op, f"activation must be one of {MOE_ACTIVATIONS}, got {activation!r}")
    require(gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0 and gate_up.shape[1] > 0, op,
            f"gate_up must be [rows, 2 * intermediate] ([gate | up]), got {list(gate_up.shape)}")
    _dtype(gate_up, FLOAT_DTYPES, op, "gate_up")


def check_moe_route_gather(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                           expert_map: torch.Tensor | None, x: torch.Tensor) -> None:
    op = "moe_route_gather"
    check_moe_route(topk_ids, topk_weights, num_experts, expert_map, op)
    _same_device(op, topk_ids=topk_ids, x=x)
    _check_token_rows(x, op)
    require(x.shape[0] == topk_ids.shape[0], op,
            f"x has {x.shape[0]} tokens but topk_ids routes {topk_ids.shape[0]} ({list(topk_ids.shape)})")


def _check_token_rows(x: torch.Tensor, op: str) -> None:
    """x of the MoE gather ops: float [tokens, hidden]."""
    require(x.dim() == 2, op, f"x must be [tokens, hidden], got {list(x.shape)}")
    _dtype(x, FLOAT_DTYPES, op, "x")


def check_moe_gather(x: torch.Tensor, src_row: torch.Tensor) -> None:
    op = "moe_gather"
    _same_device(op, x=x, src_row=src_row)
    _check_token_rows(x, op)
    require(src_row.dim() == 1, op, f"src_row must be 1-D [rows] (moe_route's), got {list(src_row.shape)}")
    _dtype(src_row, torch.int32, op, "src_row")
    require(src_row.shape[0] == 0 or x.shape[0] > 0, op, f"src_row has {src_row.shape[0]} rows but x has no tokens")


def check_moe_combine(down: torch.Tensor, slot: torch.Tensor, weights: torch.Tensor, top_k: int) -> None:
    op = "moe_combine"
    _same_device(op, down=down, slot=slot, weights=weights)
    require(top_k >= 1, op, f"top_k must be >= 1, got {top_k}")
    require(down.dim() == 2, op, f"down must be [tokens * top_k, hidden], got {list(down.shape)}")
    _dtype(down, FLOAT_DTYPES, op, "down")
    require(down.shape[0] % top_k == 0, op, f"down rows {down.shape[0]} are not a multiple of top_k={top_k}")
    require(slot.dim() == 1 and slot.shape[0] == down.shape[0], op,
            f"slot must be [{down.shape[0]}] (one sorted row per pair), got {list(slot.shape)}")
    _dtype(slot, torch.int32, op, "slot")
    require(weights.dim() == 1 and weights.shape[0] == down.shape[0], op,
            f"weights must be [{down.shape[0]}] (one per pair), got {list(weights.shape)}")
    _dtype(weights, torch.float32, op, "weights")


def check_moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                      expert_map: torch.Tensor | None, w13_packed: torch.Tensor, w13_absmax: torch.Tensor,
                      w2_packed: torch.Tensor, w2_absmax: torch.Tensor, codebook: torch.Tensor, k: int,
                      activation: str) -> None:
    """kbit_moe_experts: x [T, H], routing [T, top_k], w13 tiled [E, 2I/128.., H/32, ...], w2 [E, .., I/32, ...]."""
    op = "kbit_moe_experts"
    require(activation in MOE_ACTIVATIONS, op, f"activation must be one of {MOE_ACTIVATIONS}, got {activation!r}")
    _check_token_rows(x, op)
    require(w13_absmax.dim() == 4 and w2_absmax.dim() == 4, op,
            f"w13_absmax and w2_absmax must be stacked tiled [E, n_tiles, in/32, {TILE_N}], got "
            f"{list(w13_absmax.shape)} and {list(w2_absmax.shape)}")
    n_exp, hidden, inter = w13_absmax.shape[0], x.shape[1], w2_absmax.shape[2] * BLOCK
    require(w2_absmax.shape[0] == n_exp, op, f"w13 has {n_exp} experts but w2 has {w2_absmax.shape[0]}")
    require(w13_absmax.shape[2] * BLOCK == hidden, op,
            f"w13's in_features {w13_absmax.shape[2] * BLOCK} must equal x's hidden size {hidden}")
    check_moe_route(topk_ids, topk_weights, n_exp, expert_map, op)
    require(topk_ids.shape[0] == x.shape[0], op,
            f"x has {x.shape[0]} tokens but topk_ids routes {topk_ids.shape[0]} ({list(topk_ids.shape)})")
    check_codebook_for(codebook, k, op)
    check_tiled(w13_packed, w13_absmax, k, 2 * inter, op + " (w13)", experts=True)
    check_tiled(w2_packed, w2_absmax, k, hidden, op + " (w2)", experts=True)
    _same_device(op, x=x, topk_ids=topk_ids, w13_packed=w13_packed, w2_packed=w2_packed, codebook=codebook)
