"""moe_forward (the MoE math both frameworks share) against a per-token loop, and under torch.compile.

The loop is the definition: out[t] = sum_k w[t,k] * down_e(act(gate_e(x_t)) * up_e(x_t)). Both run
in fp32 on the same dequantized weights, so they agree to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kbit_vllm import normal_float_codebook
from kbit_vllm.layers.moe_compute import (
    gated_act_name,
    kbit_grouped,
    kbit_quantize_experts,
    kbit_repack_experts,
    kbit_unrepack_experts,
    moe_forward,
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
    got_hf = moe_forward(x, w, torch.where(ids >= 4, ids - 4, ids + 100), E, tiled["w13"], tiled["w2"], F.silu)
    torch.testing.assert_close(got_hf, want, rtol=1e-4, atol=1e-5)


def check_route(ids: torch.Tensor, w: torch.Tensor, n_exp: int, expert_map: torch.Tensor | None, got) -> None:
    """moe_route's outputs against their definition: a stable sort of the pairs by local expert."""
    src_row, slot, offsets, weights = got
    top_k = ids.shape[1]
    g = ids.reshape(-1).long().cpu()
    if expert_map is not None:
        emap = expert_map.long().cpu()
        g = torch.tensor([int(emap[i]) if 0 <= i < emap.numel() else -1 for i in g.tolist()], dtype=torch.long)
    local = (g >= 0) & (g < n_exp)
    e_of = torch.where(local, g, torch.full_like(g, n_exp - 1))
    order = sorted(range(g.numel()), key=lambda p: (int(e_of[p]), p))  # stable by expert
    assert [o.dtype for o in got] == [torch.int32, torch.int32, torch.int32, torch.float32]
    assert src_row.cpu().tolist() == [p // top_k for p in order]
    inv = [0] * len(order)
    for pos, p in enumerate(order):
        inv[p] = pos
    assert slot.cpu().tolist() == inv
    counts = torch.bincount(e_of, minlength=n_exp)
    assert offsets.cpu().tolist() == [0] + torch.cumsum(counts, 0).tolist()
    want_w = torch.where(local, w.reshape(-1).float().cpu(), torch.zeros(()))
    assert torch.equal(weights.cpu(), want_w)


def test_route_is_stable_sort_with_masking(gen: torch.Generator) -> None:
    from kbit_vllm import ops

    w, ids = routing(gen, tokens=33)
    check_route(ids, w, E, None, ops.moe_route(ids, w, E, None))
    check_route(ids.long(), w.half(), E, None, ops.moe_route(ids.long(), w.half(), E))
    bad = ids.clone()
    bad[0, 0], bad[3, 1] = -1, E + 5  # out of range: last expert, weight 0
    check_route(bad, w, E, None, ops.moe_route(bad, w, E))
    w8, ids8 = routing(gen, n_exp=8, tokens=17)
    emap = torch.tensor([-1, 2, -1, 0, 1, -1, 3, -1], dtype=torch.int32)
    check_route(ids8, w8, E, emap, ops.moe_route(ids8, w8, E, emap))
    x = torch.randn(33, H, generator=gen)
    *routed, rows = ops.moe_route_gather(ids, w, E, None, x)
    check_route(ids, w, E, None, routed)
    assert torch.equal(rows, x[routed[0].long()])


def test_gated_act_and_combine_ops(gen: torch.Generator) -> None:
    from kbit_vllm import ops

    gu = torch.randn(7, 2 * INTER, generator=gen).to(torch.bfloat16)
    g, u = gu[:, :INTER].float(), gu[:, INTER:].float()
    for name, fn in (("silu", F.silu), ("gelu", F.gelu), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))):
        assert torch.equal(ops.moe_gated_act(gu, name), (fn(g) * u).to(torch.bfloat16))
    down = torch.randn(3 * K, H, generator=gen)
    slot = torch.randperm(3 * K, generator=gen).to(torch.int32)
    wts = torch.rand(3 * K, generator=gen)
    want = torch.stack([sum(wts[t * K + k] * down[slot[t * K + k]] for k in range(K)) for t in range(3)])
    torch.testing.assert_close(ops.moe_combine(down, slot, wts, K), want, rtol=1e-6, atol=1e-6)
    src = torch.randint(0, 3, (3 * K,), generator=gen, dtype=torch.int32)
    assert torch.equal(ops.moe_gather(down[:3], src), down[:3][src.long()])


def test_glue_op_errors_name_the_op() -> None:
    import pytest

    from kbit_vllm import ops

    ids = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="moe_route: topk_weights must match"):
        ops.moe_route(ids, torch.ones(4, 3), E)
    with pytest.raises(ValueError, match="moe_route: topk_ids must be"):
        ops.moe_route(ids.float(), torch.ones(4, 2), E)
    with pytest.raises(ValueError, match=r"moe_route_gather: x has 3 tokens but topk_ids routes 4"):
        ops.moe_route_gather(ids, torch.ones(4, 2), E, None, torch.ones(3, 8))
    with pytest.raises(ValueError, match="moe_route_gather: topk_weights must match"):
        ops.moe_route_gather(ids, torch.ones(4, 3), E, None, torch.ones(4, 8))
    with pytest.raises(ValueError, match=r"moe_route_gather: x must be \[tokens, hidden\]"):
        ops.moe_route_gather(ids, torch.ones(4, 2), E, None, torch.ones(4))
    with pytest.raises(ValueError, match="moe_gated_act: activation must be one of"):
        ops.moe_gated_act(torch.ones(2, 8), "relu")
    with pytest.raises(ValueError, match=r"moe_gated_act: gate_up must be \[rows, 2 \* intermediate\]"):
        ops.moe_gated_act(torch.ones(2, 7), "silu")
    with pytest.raises(ValueError, match="moe_gather: src_row must be torch.int32, got torch.int64"):
        ops.moe_gather(torch.ones(4, 8), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"moe_gather: x must be \[tokens, hidden\]"):
        ops.moe_gather(torch.ones(4), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="moe_combine: slot must be torch.int32, got torch.int64"):
        ops.moe_combine(torch.ones(4, 8), torch.zeros(4, dtype=torch.int64), torch.ones(4), 2)
    with pytest.raises(ValueError, match="moe_combine: down rows 5 are not a multiple of top_k=2"):
        ops.moe_combine(torch.ones(5, 8), torch.zeros(5, dtype=torch.int32), torch.ones(5), 2)


def test_unfused_activation_matches_fused(gen: torch.Generator) -> None:
    """An act_fn the fused op does not know runs as torch ops with the same math."""
    tiled, _ = weights(gen)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    w, ids = routing(gen)
    assert gated_act_name(F.silu) == "silu" and gated_act_name(torch.nn.GELU("tanh")) == "gelu_tanh"
    assert gated_act_name(lambda t: F.silu(t)) is None
    tiled16 = {n: (lambda rows, offs, f=f: f(rows.float(), offs).to(rows.dtype)) for n, f in tiled.items()}
    fused = moe_forward(x, w, ids, E, tiled16["w13"], tiled16["w2"], F.silu)
    unfused = moe_forward(x, w, ids, E, tiled16["w13"], tiled16["w2"], lambda t: F.silu(t))
    assert torch.equal(fused, unfused)


def test_compiles_fullgraph(gen: torch.Generator) -> None:
    """No graph break (vLLM compiles with fullgraph=True): sort, offsets and the grouped ops trace."""
    tiled, dense = weights(gen)
    x = torch.randn(T, H, generator=gen)
    w, ids = routing(gen)

    def fwd(x, w, ids):
        return moe_forward(x, w, ids, E, tiled["w13"], tiled["w2"], F.silu)

    got = torch.compile(fwd, fullgraph=True, backend="eager")(x, w, ids)
    torch.testing.assert_close(got, loop_reference(x, w, ids, dense), rtol=1e-4, atol=1e-5)


def tiled_experts(gen: torch.Generator, bits: int = 4) -> tuple[tuple[torch.Tensor, ...], dict]:
    """(w13 packed, w13 absmax, w2 packed, w2 absmax, codebook) stacked tiled, and the fp32 dequantization."""
    cb = normal_float_codebook(bits)
    tiled, dense = [], {}
    for name, w in (("w13", torch.randn(E, 2 * INTER, H, generator=gen) * 0.1),
                    ("w2", torch.randn(E, H, INTER, generator=gen) * 0.1)):
        packed, absmax = kbit_quantize_experts(w, cb, bits, name)
        tiled += list(kbit_repack_experts(packed, absmax, bits))
        from kbit_vllm import ops

        dense[name] = torch.stack([ops.kbit_dequantize(packed[e], absmax[e], cb, bits, torch.float32)
                                   for e in range(E)])
    return (*tiled, cb), dense


def test_experts_op_is_the_five_ops(gen: torch.Generator) -> None:
    """kbit_moe_experts (one op; one kernel on CUDA at decode) is defined as moe_forward's five ops: on CPU
    it runs them, bit for bit; moe_forward hands it the whole layer when given experts_op."""
    from kbit_vllm import ops
    from kbit_vllm.layers.moe_compute import kbit_experts_op

    t, dense = tiled_experts(gen)
    w13 = kbit_grouped(t[0], t[1], t[4], 4, 2 * INTER)
    w2 = kbit_grouped(t[2], t[3], t[4], 4, H)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    w, ids = routing(gen, n_exp=8)
    for emap in (None, torch.tensor([-1, 3, -1, 0, 2, -1, 1, -1], dtype=torch.int32)):
        five = moe_forward(x, w, ids, E, w13, w2, F.silu, expert_map=emap)
        assert torch.equal(ops.kbit_moe_experts(x, ids, w, emap, *t, 4, "silu"), five)
        assert torch.equal(moe_forward(x, w, ids, E, w13, w2, F.silu, expert_map=emap,
                                       experts_op=kbit_experts_op(*t, 4)), five)
    w, ids = routing(gen)
    got = ops.kbit_moe_experts(x.float(), ids, w, None, *t, 4, "silu")
    torch.testing.assert_close(got, loop_reference(x.float(), w, ids, dense), rtol=1e-4, atol=1e-5)
    # weights on the inputs: moe_forward keeps its own path (the op weights outputs)
    w1, ids1 = routing(gen, top_k=1)
    on_input = moe_forward(x.float(), w1 * 0.7, ids1, E, w13, w2, F.silu, apply_router_weight_on_input=True,
                           experts_op=kbit_experts_op(*t, 4))
    torch.testing.assert_close(on_input, loop_reference(x.float(), w1 * 0.7, ids1, dense, on_input=True),
                               rtol=1e-4, atol=1e-5)
    compiled = torch.compile(lambda x, w, ids: ops.kbit_moe_experts(x, ids, w, None, *t, 4, "gelu"),
                             fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, w, ids), ops.kbit_moe_experts(x, ids, w, None, *t, 4, "gelu"))


def test_experts_op_errors_name_the_op(gen: torch.Generator) -> None:
    import pytest

    from kbit_vllm import ops

    t, _ = tiled_experts(gen)
    x = torch.randn(T, H, generator=gen)
    w, ids = routing(gen)
    with pytest.raises(ValueError, match="kbit_moe_experts: activation must be one of"):
        ops.kbit_moe_experts(x, ids, w, None, *t, 4, "relu")
    with pytest.raises(ValueError, match=r"kbit_moe_experts: w13's in_features 64 must equal x's hidden size 32"):
        ops.kbit_moe_experts(x[:, :32], ids, w, None, *t, 4, "silu")
    with pytest.raises(ValueError, match="kbit_moe_experts: x has 8 tokens but topk_ids routes 9"):
        ops.kbit_moe_experts(x[:8], ids, w, None, *t, 4, "silu")
    with pytest.raises(ValueError, match=r"kbit_moe_experts: w13 has 4 experts but w2 has 3"):
        ops.kbit_moe_experts(x, ids, w, None, t[0], t[1], t[2][:3], t[3][:3], t[4], 4, "silu")
    with pytest.raises(ValueError, match=r"kbit_moe_experts \(w13\): packed_tiled must be"):
        ops.kbit_moe_experts(x, ids, w, None, *t[:4], normal_float_codebook(3), 3, "silu")


def test_empty_batch(gen: torch.Generator) -> None:
    """No tokens (an idle data-parallel rank's dummy batch): an empty output, through both paths."""
    from kbit_vllm.layers.moe_compute import kbit_experts_op

    t, _ = tiled_experts(gen)
    x, w, ids = torch.zeros(0, H), torch.zeros(0, K), torch.zeros(0, K, dtype=torch.int32)
    w13 = kbit_grouped(t[0], t[1], t[4], 4, 2 * INTER)
    w2 = kbit_grouped(t[2], t[3], t[4], 4, H)
    for op in (None, kbit_experts_op(*t, 4)):
        assert moe_forward(x, w, ids, E, w13, w2, F.silu, experts_op=op).shape == (0, H)
