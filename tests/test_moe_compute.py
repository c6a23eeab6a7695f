"""moe_forward (the MoE math both frameworks share) against a per-token loop, and under torch.compile.

The loop is the definition: out[t] = sum_k w[t,k] * down_e(act(gate_e(x_t)) * up_e(x_t)). Both run
in fp32 on the same dequantized weights, so they agree to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kbit_vllm import normal_float_codebook
from kbit_vllm.layers.moe_compute import (
    kbit_grouped,
    kbit_quantize_experts,
    kbit_repack_experts,
    kbit_unrepack_experts,
    moe_forward,
    sort_by_expert,
)

E, H, INTER, K, T = 4, 64, 96, 2, 9


def weights(gen: torch.Generator, bits: int = 4):
    cb = normal_float_codebook(bits)
    w13 = torch.randn(E, 2 * INTER, H, generator=gen) * 0.1
    w2 = torch.randn(E, H, INTER, generator=gen) * 0.1
    tiled = {}
    dense = {}
    for name, w in (("w13", w13), ("w2", w2)):
        packed, absmax = kbit_quantize_experts(w, cb, bits, name)
        packed_t, absmax_t = kbit_repack_experts(packed, absmax, bits)
        back = kbit_unrepack_experts(packed_t, absmax_t, bits, w.shape[1])
        assert torch.equal(back[0], packed) and torch.equal(back[1], absmax)
        tiled[name] = kbit_grouped(packed_t, absmax_t, cb, bits, w.shape[1])
        from kbit_vllm import ops

        dense[name] = torch.stack([ops.kbit_dequantize(packed[e], absmax[e], cb, bits, torch.float32)
                                   for e in range(E)])
    return tiled, dense


def loop_reference(x, topk_w, topk_ids, dense, on_input=False, local=None):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[t, k])
            if local is not None and not local(e):
                continue
            xi = x[t] * topk_w[t, k] if on_input else x[t]
            h = dense["w13"][e] @ xi
            y = dense["w2"][e] @ (F.silu(h[:INTER]) * h[INTER:])
            out[t] += y if on_input else topk_w[t, k] * y
    return out


def routing(gen: torch.Generator, n_exp: int = E, top_k: int = K, tokens: int = T):
    logits = torch.randn(tokens, n_exp, generator=gen)
    w, ids = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def test_matches_loop(gen: torch.Generator) -> None:
    tiled, dense = weights(gen)
    x = torch.randn(T, H, generator=gen)
    w, ids = routing(gen)
    got = moe_forward(x, w, ids, E, tiled["w13"], tiled["w2"], F.silu)
    torch.testing.assert_close(got, loop_reference(x, w, ids, dense), rtol=1e-4, atol=1e-5)


def test_router_weight_on_input_top1(gen: torch.Generator) -> None:
    tiled, dense = weights(gen)
    x = torch.randn(T, H, generator=gen)
    w, ids = routing(gen, top_k=1)
    w = w * 0.7  # not renormalized, so input vs output weighting differ
    got = moe_forward(x, w, ids, E, tiled["w13"], tiled["w2"], F.silu, apply_router_weight_on_input=True)
    torch.testing.assert_close(got, loop_reference(x, w, ids, dense, on_input=True), rtol=1e-4, atol=1e-5)


def test_expert_parallel_map(gen: torch.Generator) -> None:
    """8 global experts, this rank owns global 4..7 as local 0..3; the rest contribute nothing."""
    tiled, dense = weights(gen)
    x = torch.randn(T, H, generator=gen)
    w, ids = routing(gen, n_exp=8)
    expert_map = torch.tensor([-1, -1, -1, -1, 0, 1, 2, 3], dtype=torch.int32)
    got = moe_forward(x, w, ids, E, tiled["w13"], tiled["w2"], F.silu, expert_map=expert_map)
    want = loop_reference(x, w, ids - 4, dense, local=lambda e: e >= 0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # HF sentinel ids (>= E) are dropped the same way
    got_hf = moe_forward(x, w, torch.where(ids >= 4, ids - 4, ids + 100), E, tiled["w13"], tiled["w2"], F.silu,
                         mask_foreign=True)
    torch.testing.assert_close(got_hf, want, rtol=1e-4, atol=1e-5)


def test_offsets_on_device_and_sorted(gen: torch.Generator) -> None:
    _, ids = routing(gen, tokens=33)
    order, offsets, local = sort_by_expert(ids, E)
    assert local is None and offsets.dtype == torch.int32 and offsets.tolist()[0] == 0
    assert offsets.tolist()[-1] == ids.numel()
    flat = ids.reshape(-1)[order]
    for e in range(E):
        assert (flat[offsets[e]:offsets[e + 1]] == e).all()


def test_compiles_fullgraph(gen: torch.Generator) -> None:
    """No graph break (vLLM compiles with fullgraph=True): sort, offsets and the grouped ops trace."""
    tiled, dense = weights(gen)
    x = torch.randn(T, H, generator=gen)
    w, ids = routing(gen)

    def fwd(x, w, ids):
        return moe_forward(x, w, ids, E, tiled["w13"], tiled["w2"], F.silu)

    got = torch.compile(fwd, fullgraph=True, backend="eager")(x, w, ids)
    torch.testing.assert_close(got, loop_reference(x, w, ids, dense), rtol=1e-4, atol=1e-5)
