"""kbit_moe_experts on the GPU: the one-kernel path (csrc/kbit_moe_experts.cu) against its definition,
the five-op path, and against a float64 per-token loop on the dequantized experts.

The fused kernel adds fp32 partial sums in L2 in a run-dependent order and keeps each pair's down
output in fp32 (the five ops round it to the activation dtype before the combine), so it matches
the five ops to a few units in the last place of the output dtype, not bit for bit; both match
the float64 loop within the kbit error budget. Inputs are fresh random tensors on every run; the
fused output is poisoned (NaN) before each call, so an element the kernel never writes shows.
Skips without a CUDA GPU or a library built for it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cuda_helpers import assert_close_max_norm, cuda_kernels_ok

from kbit_vllm import normal_float_codebook, ops
from kbit_vllm.backends.cuda import dispatch, moe_experts
from kbit_vllm.backends.cuda.moe_experts import moe_experts_path
from kbit_vllm.layers.moe_compute import kbit_quantize_experts, kbit_repack_experts

_OK, _WHY = cuda_kernels_ok()
pytestmark = pytest.mark.skipif(not _OK, reason=f"CUDA kbit MoE experts kernel unavailable: {_WHY}")

DEV = "cuda"
# Against the five ops: the per-pair down outputs they round to fp16 / bf16 before the weighted sum.
TOL_UNFUSED = {torch.float16: 4e-3, torch.bfloat16: 2e-2}
TOL_LOOP = 3e-2  # against float64 on the dequantized experts (kbit GEMV budget, as the MoE glue tests)
_GATES = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def _experts(n_exp: int, hidden: int, inter: int, k: int, gen: torch.Generator) -> tuple[tuple, dict]:
    """Stacked tiled kbit experts (w13 [gate | up], w2) on one codebook, and their float64 dequantization."""
    cb = normal_float_codebook(k).to(DEV)
    tiled, dense = [], {}
    for name, (o, i) in (("w13", (2 * inter, hidden)), ("w2", (hidden, inter))):
        w = (torch.randn(n_exp, o, i, generator=gen) * 0.05).to(DEV)
        packed, absmax = kbit_quantize_experts(w, cb, k, name)
        tiled += list(kbit_repack_experts(packed, absmax, k))
        dense[name] = torch.stack([ops.kbit_dequantize(packed[e], absmax[e], cb, k, torch.float64)
                                   for e in range(n_exp)])
    return (*tiled, cb), dense


def _routing(tokens: int, n_exp: int, top_k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(tokens, n_exp, generator=gen) + 3 * torch.rand(n_exp, generator=gen) ** 4
    w, ids = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
    return (w / w.sum(-1, keepdim=True)).to(DEV), ids.to(torch.int32).to(DEV)


def _loop(x, w, ids, dense, act: str = "silu", local=None) -> torch.Tensor:
    """float64 per-token definition of the routed experts (local maps a global id to a local one or -1)."""
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64, device=x.device)
    inter = dense["w2"].shape[2]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) if local is None else local(int(ids[t, j]))
            if e < 0:
                continue
            h = dense["w13"][e] @ x[t].double()
            out[t] += float(w[t, j]) * (dense["w2"][e] @ (_GATES[act](h[:inter]) * h[inter:]))
    return out


def _fused(x, w, ids, emap, weights, k, act="silu") -> torch.Tensor:
    out = torch.full_like(x, float("nan"))
    return moe_experts_path(x, ids, w, emap, *weights, k, act, path="fused", out=out)


def _unfused(x, w, ids, emap, weights, k, act="silu") -> torch.Tensor:
    return moe_experts_path(x, ids, w, emap, *weights, k, act, path="unfused")


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize("k", (2, 3, 4, 5))
@pytest.mark.parametrize("tokens,n_exp,top_k,hidden,inter", [(1, 64, 8, 512, 256), (3, 16, 4, 256, 384),
                                                             (8, 128, 8, 384, 128), (16, 8, 8, 256, 256),
                                                             (2, 8, 2, 96, 128)])
def test_fused_equals_five_ops_and_loop(tokens, n_exp, top_k, hidden, inter, k, dtype, gen):
    weights, dense = _experts(n_exp, hidden, inter, k, gen)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(DEV)
    w, ids = _routing(tokens, n_exp, top_k, gen)
    got = _fused(x, w, ids, None, weights, k)
    assert_close_max_norm(got, _unfused(x, w, ids, None, weights, k), TOL_UNFUSED[dtype], "fused vs five ops")
    assert_close_max_norm(got, _loop(x, w, ids, dense), TOL_LOOP, "fused vs float64 loop")


@pytest.mark.parametrize("act", ("gelu", "gelu_tanh"))
def test_fused_activations(act, gen):
    weights, dense = _experts(32, 256, 256, 4, gen)
    x = torch.randn(2, 256, generator=gen).to(torch.bfloat16).to(DEV)
    w, ids = _routing(2, 32, 4, gen)
    got = _fused(x, w, ids, None, weights, 4, act)
    assert_close_max_norm(got, _unfused(x, w, ids, None, weights, 4, act), TOL_UNFUSED[torch.bfloat16], act)
    assert_close_max_norm(got, _loop(x, w, ids, dense, act), TOL_LOOP, act)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_fused_rows_of_mixed_magnitude(dtype, gen):
    """Per-block power-of-two staging: rows far outside [-1, 1] (and one tiny) keep full precision."""
    weights, dense = _experts(16, 256, 256, 4, gen)
    x = torch.randn(4, 256, generator=gen)
    x[0] *= 30.0 if dtype == torch.float16 else 1e5
    x[1] *= 0.05 if dtype == torch.float16 else 1e-3  # fp16 outputs of 1e-3 rows would be subnormal
    x[2, :32] *= 50.0
    x = x.to(dtype).to(DEV)
    w, ids = _routing(4, 16, 4, gen)
    got = _fused(x, w, ids, None, weights, 4)
    want = _loop(x, w, ids, dense)
    for t in range(4):  # each token against its own scale
        assert_close_max_norm(got[t], want[t], TOL_LOOP, f"token {t}")


def test_fused_expert_parallel_map(gen):
    """expert_map: global ids mapped to local ones, -1 (another rank's) and out-of-range ids add nothing."""
    n_global, n_local, tokens, top_k = 48, 16, 6, 6
    weights, dense = _experts(n_local, 256, 128, 4, gen)
    emap = torch.full((n_global,), -1, dtype=torch.int32)
    emap[torch.randperm(n_global, generator=gen)[:n_local]] = torch.arange(n_local, dtype=torch.int32)
    emap = emap.to(DEV)
    x = torch.randn(tokens, 256, generator=gen).to(torch.bfloat16).to(DEV)
    w, ids = _routing(tokens, n_global, top_k, gen)
    ids[0, 0] = n_global + 3  # unknown ids contribute nothing
    ids[1, 1] = -1
    emap_cpu = emap.cpu()

    def local(e: int) -> int:
        return int(emap_cpu[e]) if 0 <= e < n_global else -1

    got = _fused(x, w, ids, emap, weights, 4)
    assert_close_max_norm(got, _unfused(x, w, ids, emap, weights, 4), TOL_UNFUSED[torch.bfloat16], "vs five ops")
    assert_close_max_norm(got, _loop(x, w, ids, dense, local=local), TOL_LOOP, "vs loop")
    nobody = torch.full_like(emap, -1)  # no pair is served here: the output is exactly zero
    assert torch.equal(_fused(x, w, ids, nobody, weights, 4), torch.zeros_like(x))


def test_fused_back_to_back_and_graph_replay(gen):
    """Calls queued without a sync each see flags and sums left zero by the one before; a captured call
    replays under new routing and inputs."""
    n_exp, hidden, inter, top_k, tokens = 64, 512, 256, 8, 4
    weights, _ = _experts(n_exp, hidden, inter, 4, gen)
    cases = []
    for _ in range(5):
        w, ids = _routing(tokens, n_exp, top_k, gen)
        cases.append((torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16).to(DEV), w, ids))
    outs = [_fused(x, w, ids, None, weights, 4) for x, w, ids in cases]
    for (x, w, ids), got in zip(cases, outs, strict=True):
        assert_close_max_norm(got, _unfused(x, w, ids, None, weights, 4), TOL_UNFUSED[torch.bfloat16], "queued")
    x, w, ids = (t.clone() for t in cases[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_experts_path(x, ids, w, None, *weights, 4, "silu", path="fused")
    for xn, wn, idn in cases[1:]:
        x.copy_(xn)
        w.copy_(wn)
        ids.copy_(idn)
        out.fill_(float("nan"))
        graph.replay()
        assert_close_max_norm(out, _unfused(x, w, ids, None, weights, 4), TOL_UNFUSED[torch.bfloat16], "replay")


def test_op_dispatch_and_fallbacks(gen, monkeypatch):
    """The op takes the kernel for decode-sized batches and the five ops elsewhere: an intermediate
    size that is not a multiple of 128 (where the fused path refuses), more pairs than dispatch takes."""
    taken = []

    def spy(*args, path, **kw):
        taken.append(path)
        return moe_experts_path(*args, path=path, **kw)

    monkeypatch.setattr(moe_experts, "moe_experts_path", spy)
    weights, dense = _experts(16, 256, 96, 4, gen)
    x = torch.randn(2, 256, generator=gen).to(torch.bfloat16).to(DEV)
    w, ids = _routing(2, 16, 4, gen)
    with pytest.raises(ValueError, match="kbit_moe_experts: the fused kernel takes"):
        _fused(x, w, ids, None, weights, 4)
    got = ops.kbit_moe_experts(x, ids, w, None, *weights, 4, "silu")
    assert taken[-1] == "unfused"
    assert_close_max_norm(got, _loop(x, w, ids, dense), TOL_LOOP, "intermediate 96")
    weights, dense = _experts(32, 256, 128, 3, gen)
    tokens = dispatch.MOE_FUSED_MAX_PAIRS // 4 + 1
    x = torch.randn(tokens, 256, generator=gen).to(torch.float16).to(DEV)
    w, ids = _routing(tokens, 32, 4, gen)
    ops.kbit_moe_experts(x, ids, w, None, *weights, 3, "silu")
    assert taken[-1] == "unfused"
    x, w, ids = x[:2].contiguous(), w[:2].contiguous(), ids[:2].contiguous()
    got = ops.kbit_moe_experts(x, ids, w, None, *weights, 3, "silu")
    assert taken[-1] == ("unfused" if dispatch.deterministic() else "fused")
    assert_close_max_norm(got, _loop(x, w, ids, dense), TOL_LOOP, "two tokens")
