"""The kbit_vllm:: custom ops: schemas and fake (meta) implementations.

Layers and configs call only these ops. Device implementations live in backends/ and are
registered when the package is imported. Every fake runs the same input checks as the real
implementations, so torch.compile reports bad shapes at trace time.

Resident (kernel) layouts:
  kbit: see formats/kbit_layout.py (tiled, TILE_N rows per tile).
  awq : device-specific, always sz [in/group_size, out, 2] in the activation dtype.
        CPU: wq = PyTorch int4pack uint8 [out, in/2] when the shape allows, else the AWQ qweight
        int32 [in, out/8] unchanged; sz holds (scale, offset), w = (q - 8) * scale + offset.
        CUDA: wq = qweight^T int32 [out/8, in]; sz holds (s_2p, s_2p+1, b_2p, b_2p+1) per
        output pair, w = q * s + b (backends/cuda/awq_ops.py, csrc/awq_common.cuh).
"""

from __future__ import annotations

import torch

from . import op_checks as C
from .formats import TILE_N, n_tiles_for

NS = "kbit_vllm"

_SCHEMAS = {
    "kbit_quantize": "(Tensor weight, Tensor codebook, int k) -> (Tensor, Tensor)",
    "kbit_dequantize": "(Tensor packed, Tensor absmax, Tensor codebook, int k, ScalarType dtype) -> Tensor",
    "kbit_repack": "(Tensor packed, Tensor absmax, int k) -> (Tensor, Tensor)",
    "kbit_unrepack": "(Tensor packed_tiled, Tensor absmax_tiled, int k, int out_features) -> (Tensor, Tensor)",
    "kbit_linear": "(Tensor x, Tensor packed_tiled, Tensor absmax_tiled, Tensor codebook, Tensor? bias, "
    "int k, int out_features) -> Tensor",
    "kbit_grouped_linear": "(Tensor x, Tensor packed_tiled, Tensor absmax_tiled, Tensor codebook, "
    "Tensor expert_offsets, int k, int out_features) -> Tensor",
    "awq_dequantize": "(Tensor qweight, Tensor qzeros, Tensor scales, int group_size) -> Tensor",
    "awq_repack": "(Tensor qweight, Tensor qzeros, Tensor scales, int group_size, ScalarType dtype) "
    "-> (Tensor, Tensor)",
    "awq_unrepack": "(Tensor wq, int in_features, int out_features) -> Tensor",
    "awq_linear": "(Tensor x, Tensor wq, Tensor sz, Tensor? bias, int group_size, int out_features) -> Tensor",
    "awq_grouped_linear": "(Tensor x, Tensor wq, Tensor sz, Tensor expert_offsets, int group_size, "
    "int out_features) -> Tensor",
    "moe_route": "(Tensor topk_ids, Tensor topk_weights, int num_experts, Tensor? expert_map) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
    "moe_gather": "(Tensor x, Tensor src_row) -> Tensor",
    "moe_route_gather": "(Tensor topk_ids, Tensor topk_weights, int num_experts, Tensor? expert_map, Tensor x) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "moe_gated_act": "(Tensor gate_up, str activation) -> Tensor",
    "moe_combine": "(Tensor down, Tensor slot, Tensor weights, int top_k) -> Tensor",
    "kbit_moe_experts": "(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor? expert_map, Tensor w13_packed, "
    "Tensor w13_absmax, Tensor w2_packed, Tensor w2_absmax, Tensor codebook, int k, str activation) -> Tensor",
}

_lib = torch.library.Library(NS, "DEF")
for _name, _schema in _SCHEMAS.items():
    _lib.define(_name + _schema)


def _fake(name: str):
    return torch.library.register_fake(f"{NS}::{name}", lib=_lib)


@_fake("kbit_quantize")
def _(weight, codebook, k):
    C.check_quantize(weight, codebook, k)
    out_f, in_f = weight.shape
    nb = in_f // 32
    return (weight.new_empty((out_f, nb * k), dtype=torch.int32),
            weight.new_empty((out_f, nb), dtype=torch.uint8))


@_fake("kbit_dequantize")
def _(packed, absmax, codebook, k, dtype):
    C.check_serialized(packed, absmax, k, "kbit_dequantize")
    C.check_codebook_for(codebook, k, "kbit_dequantize")
    return packed.new_empty((absmax.shape[0], absmax.shape[1] * 32), dtype=dtype)


@_fake("kbit_repack")
def _(packed, absmax, k):
    C.check_serialized(packed, absmax, k, "kbit_repack")
    nt, nb = n_tiles_for(absmax.shape[0]), absmax.shape[1]
    return (packed.new_empty((nt, nb, k, TILE_N)), absmax.new_empty((nt, nb, TILE_N)))


@_fake("kbit_unrepack")
def _(packed_tiled, absmax_tiled, k, out_features):
    C.check_tiled(packed_tiled, absmax_tiled, k, out_features, "kbit_unrepack")
    nb = absmax_tiled.shape[1]
    return (packed_tiled.new_empty((out_features, nb * k)), absmax_tiled.new_empty((out_features, nb)))


@_fake("kbit_linear")
def _(x, packed_tiled, absmax_tiled, codebook, bias, k, out_features):
    C.check_kbit_linear(x, packed_tiled, absmax_tiled, codebook, bias, k, out_features)
    return x.new_empty((*x.shape[:-1], out_features))


@_fake("kbit_grouped_linear")
def _(x, packed_tiled, absmax_tiled, codebook, expert_offsets, k, out_features):
    C.check_grouped(x, packed_tiled, absmax_tiled, codebook, expert_offsets, k, out_features)
    return x.new_empty((x.shape[0], out_features))


@_fake("awq_dequantize")
def _(qweight, qzeros, scales, group_size):
    C.check_awq(qweight, qzeros, scales, group_size, "awq_dequantize")
    return scales.new_empty((scales.shape[1], qweight.shape[0]))


@_fake("awq_repack")
def _(qweight, qzeros, scales, group_size, dtype):
    C.check_awq(qweight, qzeros, scales, group_size, "awq_repack")
    from .backends import awq_resident_shape  # device-specific layout, decided by the backend

    wq_shape, wq_dtype = awq_resident_shape(qweight.device, qweight.shape[0], scales.shape[1], group_size)
    sz = scales.new_empty((scales.shape[0], scales.shape[1], 2), dtype=dtype)
    return qweight.new_empty(wq_shape, dtype=wq_dtype), sz


@_fake("awq_unrepack")
def _(wq, in_features, out_features):
    C.check_awq_unrepack(wq, in_features, out_features)
    return wq.new_empty((in_features, out_features // 8), dtype=torch.int32)


@_fake("awq_linear")
def _(x, wq, sz, bias, group_size, out_features):
    C.check_awq_linear(x, wq, sz, bias, group_size, out_features)
    return x.new_empty((*x.shape[:-1], out_features))


@_fake("awq_grouped_linear")
def _(x, wq, sz, expert_offsets, group_size, out_features):
    C.check_awq_grouped(x, wq, sz, expert_offsets, group_size, out_features)
    return x.new_empty((x.shape[0], out_features))


def _route_outputs(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, ...]:
    """moe_route's (src_row, slot, expert_offsets, weights), shaped for the fakes."""
    n = topk_ids.numel()
    i32 = dict(dtype=torch.int32, device=topk_ids.device)
    return (torch.empty(n, **i32), torch.empty(n, **i32), torch.empty(num_experts + 1, **i32),
            torch.empty(n, dtype=torch.float32, device=topk_ids.device))


@_fake("moe_route")
def _(topk_ids, topk_weights, num_experts, expert_map):
    C.check_moe_route(topk_ids, topk_weights, num_experts, expert_map)
    return _route_outputs(topk_ids, num_experts)


@_fake("moe_gather")
def _(x, src_row):
    C.check_moe_gather(x, src_row)
    return x.new_empty((src_row.shape[0], x.shape[1]))


@_fake("moe_route_gather")
def _(topk_ids, topk_weights, num_experts, expert_map, x):
    C.check_moe_route_gather(topk_ids, topk_weights, num_experts, expert_map, x)
    return (*_route_outputs(topk_ids, num_experts), x.new_empty((topk_ids.numel(), x.shape[1])))


@_fake("moe_gated_act")
def _(gate_up, activation):
    C.check_moe_gated_act(gate_up, activation)
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


@_fake("moe_combine")
def _(down, slot, weights, top_k):
    C.check_moe_combine(down, slot, weights, top_k)
    return down.new_empty((down.shape[0] // top_k, down.shape[1]))


@_fake("kbit_moe_experts")
def _(x, topk_ids, topk_weights, expert_map, w13_packed, w13_absmax, w2_packed, w2_absmax, codebook, k, activation):
    C.check_moe_experts(x, topk_ids, topk_weights, expert_map, w13_packed, w13_absmax, w2_packed, w2_absmax,
                        codebook, k, activation)
    return x.new_empty(x.shape)


# --- Python entry points: thin, typed wrappers over torch.ops.kbit_vllm ---------------------

_ops = getattr(torch.ops, NS)


def kbit_quantize(weight: torch.Tensor, codebook: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] -> serialized (packed int32 [out, in/32*k], absmax uint8 [out, in/32])."""
    return _ops.kbit_quantize(weight, codebook, k)


def kbit_dequantize(packed: torch.Tensor, absmax: torch.Tensor, codebook: torch.Tensor, k: int,
                    dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Serialized kbit -> W [out, in] in dtype."""
    return _ops.kbit_dequantize(packed, absmax, codebook, k, dtype)


def kbit_repack(packed: torch.Tensor, absmax: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Serialized -> tiled resident layout (run once at load)."""
    return _ops.kbit_repack(packed, absmax, k)


def kbit_unrepack(packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor, k: int,
                  out_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled resident layout -> serialized (for saving)."""
    return _ops.kbit_unrepack(packed_tiled, absmax_tiled, k, out_features)


def kbit_linear(x: torch.Tensor, packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor,
                codebook: torch.Tensor, bias: torch.Tensor | None, k: int, out_features: int) -> torch.Tensor:
    """y = x @ W^T + bias over any leading dims, W in the tiled layout."""
    return _ops.kbit_linear(x, packed_tiled, absmax_tiled, codebook, bias, k, out_features)


def kbit_grouped_linear(x: torch.Tensor, packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor,
                        codebook: torch.Tensor, expert_offsets: torch.Tensor, k: int,
                        out_features: int) -> torch.Tensor:
    """MoE: rows expert_offsets[e]:expert_offsets[e+1] of x use expert e's weight."""
    return _ops.kbit_grouped_linear(x, packed_tiled, absmax_tiled, codebook, expert_offsets, k, out_features)


def awq_dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                   group_size: int) -> torch.Tensor:
    """AutoAWQ tensors -> dense W [out, in] in the scales' dtype."""
    return _ops.awq_dequantize(qweight, qzeros, scales, group_size)


def awq_repack(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAWQ tensors -> this device's resident layout (wq, scales_and_offsets in dtype)."""
    return _ops.awq_repack(qweight, qzeros, scales, group_size, dtype)


def awq_unrepack(wq: torch.Tensor, in_features: int, out_features: int) -> torch.Tensor:
    """Resident wq from awq_repack -> the AutoAWQ qweight int32 [in, out/8] it was built from, bit-exact
    (for saving; qzeros and scales are not part of wq)."""
    return _ops.awq_unrepack(wq, in_features, out_features)


def awq_linear(x: torch.Tensor, wq: torch.Tensor, sz: torch.Tensor, bias: torch.Tensor | None,
               group_size: int, out_features: int) -> torch.Tensor:
    """y = x @ W^T + bias with W in the resident AWQ layout from awq_repack."""
    return _ops.awq_linear(x, wq, sz, bias, group_size, out_features)


def awq_grouped_linear(x: torch.Tensor, wq: torch.Tensor, sz: torch.Tensor, expert_offsets: torch.Tensor,
                       group_size: int, out_features: int) -> torch.Tensor:
    """MoE: rows expert_offsets[e]:expert_offsets[e+1] of x use expert e's resident AWQ weight.

    wq and sz are awq_repack's outputs stacked over experts: wq [E, *resident], sz [E, G, out, 2].
    """
    return _ops.awq_grouped_linear(x, wq, sz, expert_offsets, group_size, out_features)


def moe_route(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
              expert_map: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Order a batch's (token, k) pairs by local expert, stably, on the device (no host sync).

    Pair p = t * top_k + k. Returns (src_row int32 [P]: the token of each sorted row, slot int32
    [P]: the sorted row of each pair, expert_offsets int32 [E + 1], weights fp32 [P]: each pair's
    router weight). expert_map maps global to local ids (-1: another rank's expert). A pair whose
    local id is outside [0, num_experts) is routed to the last expert with weight 0, so every row
    has a group and the offsets end at P.
    """
    return _ops.moe_route(topk_ids, topk_weights, num_experts, expert_map)


def moe_gather(x: torch.Tensor, src_row: torch.Tensor) -> torch.Tensor:
    """x [T, H] -> x[src_row] [rows, H]: the tokens' rows in moe_route's expert order (src_row int32)."""
    return _ops.moe_gather(x, src_row)


def moe_route_gather(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                     expert_map: torch.Tensor | None, x: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_route's four outputs, then moe_gather(x, src_row): on CUDA one launch for a decode-sized
    batch (the routing CTA copies the rows), so the MoE layer's first kernel yields its GEMM's input."""
    return _ops.moe_route_gather(topk_ids, topk_weights, num_experts, expert_map, x)


def moe_gated_act(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """[rows, 2I] ([gate | up]) -> act(gate) * up [rows, I], in fp32 with one rounding."""
    return _ops.moe_gated_act(gate_up, activation)


def moe_combine(down: torch.Tensor, slot: torch.Tensor, weights: torch.Tensor, top_k: int) -> torch.Tensor:
    """out[t] = sum_k weights[t*top_k + k] * down[slot[t*top_k + k]], in fp32 in k order, one rounding."""
    return _ops.moe_combine(down, slot, weights, top_k)


def kbit_moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                     expert_map: torch.Tensor | None, w13_packed: torch.Tensor, w13_absmax: torch.Tensor,
                     w2_packed: torch.Tensor, w2_absmax: torch.Tensor, codebook: torch.Tensor, k: int,
                     activation: str) -> torch.Tensor:
    """A MoE layer's routed experts in one op: out[t] = sum_j w[t,j] * down_e(act(gate_e(x_t)) * up_e(x_t)),
    e = the local id of topk_ids[t, j] (moe_route's rule: pairs not served here contribute nothing).

    x [T, H]; the stacked tiled experts of w13 ([gate | up], out 2I) and w2 (out H) share one codebook.
    Defined as moe_route_gather -> kbit_grouped_linear -> moe_gated_act -> kbit_grouped_linear ->
    moe_combine; on CUDA a decode-sized batch runs it as one kernel (csrc/kbit_moe_experts.cu).
    """
    return _ops.kbit_moe_experts(x, topk_ids, topk_weights, expert_map, w13_packed, w13_absmax, w2_packed,
                                 w2_absmax, codebook, k, activation)
