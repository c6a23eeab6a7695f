"""CUDA MoE glue ops (moe_route, moe_gather, moe_route_gather, moe_gated_act, moe_combine) against the PyTorch
reference, and the
whole moe_forward on the GPU against a per-token float64 loop, eager and replayed in a CUDA graph.

moe_route must equal the reference bit for bit (a stable sort: the order is defined). The gated
activation and the combine compute in fp32 and round once; the CUDA math library and torch's
may differ in the last fp32 bit, so they are checked to one unit in the last place of the output
dtype. Outputs come from torch's caching allocator; each test first fills freed blocks with 0xFF
bytes (NaN / -1), so an output element a kernel never writes shows up. Skips without a CUDA GPU
or a library built for it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cuda_helpers import cuda_kernels_ok, poison_allocator

from kbit_vllm import normal_float_codebook, ops
from kbit_vllm.backends import reference as ref
from kbit_vllm.layers.moe_compute import kbit_grouped, kbit_quantize_experts, kbit_repack_experts, moe_forward

_OK, _WHY = cuda_kernels_ok()
pytestmark = pytest.mark.skipif(not _OK, reason=f"CUDA MoE glue kernels unavailable: {_WHY}")

DEV = "cuda"
ULP = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def _routing(tokens: int, n_exp: int, top_k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Skewed random top-k routing (distinct experts per token), weights renormalized."""
    logits = torch.randn(tokens, n_exp, generator=gen) + 3 * torch.rand(n_exp, generator=gen) ** 4
    w, ids = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
    return (w / w.sum(-1, keepdim=True)).to(DEV), ids.to(torch.int32).to(DEV)


@pytest.mark.parametrize("tokens,n_exp,top_k", [(1, 8, 2), (1, 128, 8), (7, 60, 4), (128, 128, 8), (129, 128, 8),
                                                (300, 512, 6), (2048, 128, 8), (50, 1000, 1), (256, 128, 8),
                                                (5000, 60, 4), (1500, 1000, 2)])
def test_route_equals_reference(tokens, n_exp, top_k, gen):
    """Above moe_ops.ROUTE_SPLIT_PAIRS pairs (1024: 128 tokens of top-8 is the last one-CTA case,
    129 a split one with a short last chunk, 256 one of whole chunks) the routing splits over CTAs
    of 1024 pairs; the order must not change: still the reference's stable sort."""
    w, ids = _routing(tokens, n_exp, top_k, gen)
    cases = [(ids, w, None), (ids.long(), w.half(), None)]
    bad = ids.clone()
    bad.view(-1)[torch.randint(0, bad.numel(), (max(1, bad.numel() // 7),), generator=gen)] = n_exp + 3
    cases.append((bad, w, None))  # out-of-range ids: last expert, weight 0
    n_global = 2 * n_exp
    emap = torch.full((n_global,), -1, dtype=torch.int32)
    emap[torch.randperm(n_global, generator=gen)[:n_exp]] = torch.randperm(n_exp, generator=gen).to(torch.int32)
    cases.append((ids, w, emap.to(DEV)))  # expert parallel: half the global experts are foreign
    for i, (c_ids, c_w, c_map) in enumerate(cases):
        poison_allocator(64 << 20)
        got = ops.moe_route(c_ids, c_w, n_exp, c_map)
        want = ref.moe_route(c_ids, c_w, n_exp, c_map)
        for name, g, r in zip(("src_row", "slot", "offsets", "weights"), got, want, strict=True):
            assert g.dtype == r.dtype and g.shape == r.shape, f"case {i} {name}"
            assert torch.equal(g, r), f"case {i} {name}: first mismatch at {int((g != r).nonzero()[0, 0])}"


@pytest.mark.parametrize("tokens", (24, 700))
def test_route_graph_replay(tokens, gen):
    """Captured once, replayed under new routing: the offsets live on the device (700 tokens: the
    split routing, its counts scratch allocated at capture)."""
    n_exp, top_k = 64, 8
    w, ids = _routing(tokens, n_exp, top_k, gen)
    graph = torch.cuda.CUDAGraph()
    ops.moe_route(ids, w, n_exp)  # warm up outside capture
    with torch.cuda.graph(graph):
        out = ops.moe_route(ids, w, n_exp)
    for _ in range(3):
        w2, ids2 = _routing(tokens, n_exp, top_k, gen)
        ids.copy_(ids2)
        w.copy_(w2)
        graph.replay()
        for g, r in zip(out, ref.moe_route(ids, w, n_exp, None), strict=True):
            assert torch.equal(g, r)


def _within_ulp(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert not torch.isnan(got).any(), f"{what}: unwritten (NaN) outputs"
    tol = ULP[got.dtype] * want.float().abs() + 1e-6
    bad = (got.float() - want.float()).abs() > tol
    assert not bad.any(), f"{what}: {int(bad.sum())} outputs off by more than one ulp"


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize("rows,inter", [(1, 768), (37, 768), (5, 101), (300, 1536)])
def test_gated_act_equals_reference(rows, inter, dtype, gen):
    gu = (torch.randn(rows, 2 * inter, generator=gen) * 3).to(dtype).to(DEV)
    for act in ("silu", "gelu", "gelu_tanh"):
        poison_allocator(64 << 20)
        _within_ulp(ops.moe_gated_act(gu, act), ref.moe_gated_act(gu, act), f"{act} rows={rows} inter={inter}")
    # a strided view (the CUDA op reads a contiguous copy)
    view = torch.randn(rows, 4 * inter, generator=gen).to(dtype).to(DEV)[:, ::2]
    _within_ulp(ops.moe_gated_act(view, "silu"), ref.moe_gated_act(view, "silu"), "strided")


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize("tokens,top_k,hidden", [(1, 8, 2048), (33, 2, 2048), (9, 6, 100), (512, 8, 4096)])
def test_combine_equals_reference(tokens, top_k, hidden, dtype, gen):
    n = tokens * top_k
    down = torch.randn(n, hidden, generator=gen).to(dtype).to(DEV)
    slot = torch.randperm(n, generator=gen).to(torch.int32).to(DEV)
    w = torch.rand(n, generator=gen).to(DEV)
    poison_allocator(64 << 20)
    _within_ulp(ops.moe_combine(down, slot, w, top_k), ref.moe_combine(down, slot, w, top_k),
                f"tokens={tokens} top_k={top_k} hidden={hidden}")


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32))
@pytest.mark.parametrize("tokens,rows,hidden", [(1, 8, 2048), (33, 66, 2048), (9, 54, 100), (512, 4096, 4096),
                                                (5, 0, 64), (300, 1027, 72), (40, 1023, 2048)])
def test_gather_equals_index_select(tokens, rows, hidden, dtype, gen):
    """Bit for bit (a copy); hidden 100 in 2-byte dtypes is no whole number of 16-byte chunks (fallback);
    from 1024 rows a CTA copies four rows (1027: a last CTA of three)."""
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(DEV)
    src = torch.randint(0, tokens, (rows,), generator=gen, dtype=torch.int32).to(DEV)
    poison_allocator(64 << 20)
    y = ops.moe_gather(x, src)
    assert y.shape == (rows, hidden) and y.dtype == dtype
    assert torch.equal(y, x.index_select(0, src)), f"tokens={tokens} rows={rows} hidden={hidden}"


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32))
@pytest.mark.parametrize("tokens,n_exp,top_k,hidden", [(1, 128, 8, 2048), (2, 128, 8, 2048), (3, 128, 8, 2048),
                                                       (1, 8, 2, 4096), (13, 60, 4, 72), (6, 16, 2, 100),
                                                       (1000, 128, 8, 64), (40, 2000, 2, 64)])
def test_route_gather_equals_route_then_gather(tokens, n_exp, top_k, hidden, dtype, gen):
    """Bit for bit against moe_route + index_select, at row counts on both sides of the one-CTA copy
    (moe_ops.ROUTE_GATHER_MAX_BYTES: bf16 hidden 2048 top-8 is fused at 1 token, not at 2),
    rows of 9 chunks, rows of no whole chunk (fallback), > 1024 experts (reference route), with an
    expert map, and in a CUDA graph replayed under new routing and new x."""
    w, ids = _routing(tokens, n_exp, top_k, gen)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(DEV)
    n_global = 2 * n_exp
    emap = torch.full((n_global,), -1, dtype=torch.int32)
    emap[torch.randperm(n_global, generator=gen)[:n_exp]] = torch.randperm(n_exp, generator=gen).to(torch.int32)
    for c_map in (None, emap.to(DEV)):
        poison_allocator(64 << 20)
        got = ops.moe_route_gather(ids, w, n_exp, c_map, x)
        want = ref.moe_route_gather(ids, w, n_exp, c_map, x)
        for name, g, r in zip(("src_row", "slot", "offsets", "weights", "rows"), got, want, strict=True):
            assert g.dtype == r.dtype and g.shape == r.shape, f"{name}"
            assert torch.equal(g, r), f"map={c_map is not None} {name}"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.moe_route_gather(ids, w, n_exp, None, x)
    for _ in range(2):
        w2, ids2 = _routing(tokens, n_exp, top_k, gen)
        ids.copy_(ids2)
        w.copy_(w2)
        x.copy_(torch.randn(tokens, hidden, generator=gen).to(dtype))
        graph.replay()
        for g, r in zip(out, ref.moe_route_gather(ids, w, n_exp, None, x), strict=True):
            assert torch.equal(g, r), "graph replay"


def _experts(n_exp: int, hidden: int, inter: int, k: int, gen: torch.Generator):
    cb = normal_float_codebook(k).to(DEV)
    grouped, dense = {}, {}
    for name, (o, i) in (("w13", (2 * inter, hidden)), ("w2", (hidden, inter))):
        w = (torch.randn(n_exp, o, i, generator=gen) * 0.05).to(DEV)
        packed, absmax = kbit_quantize_experts(w, cb, k, name)
        pt, at = kbit_repack_experts(packed, absmax, k)
        grouped[name] = kbit_grouped(pt, at, cb, k, o)
        dense[name] = torch.stack([ops.kbit_dequantize(packed[e], absmax[e], cb, k, torch.float64)
                                   for e in range(n_exp)])
    return grouped, dense


def _loop(x, w, ids, dense) -> torch.Tensor:
    """float64 per-token definition of the MoE layer."""
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64, device=x.device)
    inter = dense["w2"].shape[2]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = dense["w13"][e] @ x[t].double()
            out[t] += float(w[t, j]) * (dense["w2"][e] @ (F.silu(h[:inter]) * h[inter:]))
    return out


@pytest.mark.parametrize("tokens", (1, 5, 70))
def test_moe_forward_on_gpu_eager_and_graph(tokens, gen):
    """moe_forward with the glue kernels and kbit grouped GEMMs, bf16, against the float64 loop;
    then captured and replayed under new routing and inputs (equal to eager)."""
    n_exp, hidden, inter, top_k = 32, 256, 192, 4
    grouped, dense = _experts(n_exp, hidden, inter, 4, gen)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16).to(DEV)
    w, ids = _routing(tokens, n_exp, top_k, gen)

    def fwd() -> torch.Tensor:
        return moe_forward(x, w, ids, n_exp, grouped["w13"], grouped["w2"], F.silu)

    got = fwd()
    want = _loop(x, w, ids, dense)
    err = float((got.double() - want).abs().max() / want.abs().max())
    assert err < 3e-2, f"tokens={tokens}: max-norm relative error {err:.3g}"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fwd()
    for _ in range(2):
        w2, ids2 = _routing(tokens, n_exp, top_k, gen)
        w.copy_(w2)
        ids.copy_(ids2)
        x.copy_(torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16))
        graph.replay()
        eager = fwd()
        err = float((out.double() - eager.double()).abs().max() / eager.double().abs().max())
        assert err < 1e-2, f"tokens={tokens}: graph replay vs eager {err:.3g}"
