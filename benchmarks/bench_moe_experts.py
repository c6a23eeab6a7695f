"""kbit_moe_experts (a MoE layer's routed experts as one op) on the GPU: its one-kernel path against the
five ops it fuses (route + gather, gate/up GEMM, gated activation, down GEMM, combine) and against
cuBLAS fp16 bmm of the same active experts' gate/up and down, timed as DESIGN.md says.

Scenarios (bench_moe.py's): qwen128, 128 experts top-8 of hidden 2048 / intermediate 768 (w13
2048 -> 1536, w2 768 -> 2048); seed8, 8 experts every token to all 8 of hidden 2048 / intermediate
512. One CUDA graph calls the op over COPIES copies of the stacked experts, each with a routing of
its own, so the active experts' weights exceed the L2; median of replays, per call. The fp16
baseline is two torch.bmm over the active experts' weights, pre-gathered, rows padded to the
busiest expert (what a framework without grouped kernels runs), without the activation, the
gather or the weighted sum that a layer also needs. x is bf16 (vLLM's MoE dtype) for the kbit ops.

Usage (GPU machine, repo root): python benchmarks/bench_moe_experts.py [--ks 4] [--tokens 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kbit import start_run, time_graph  # noqa: E402

from kbit_vllm import normal_float_codebook  # noqa: E402
from kbit_vllm.backends.cuda import dispatch  # noqa: E402
from kbit_vllm.backends.cuda.moe_experts import moe_experts_path  # noqa: E402
from kbit_vllm.layers.moe_compute import kbit_quantize_experts, kbit_repack_experts  # noqa: E402

SCENARIOS = {"qwen128": (128, 8, 2048, 768), "seed8": (8, 8, 2048, 512)}  # experts, top-k, hidden, inter
COPIES = 8


def routing(n_exp: int, top_k: int, tokens: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w, ids = torch.topk(torch.softmax(torch.randn(tokens, n_exp, generator=gen), -1), top_k, dim=-1)
    return (w / w.sum(-1, keepdim=True)).cuda(), ids.to(torch.int32).cuda()


def bench(scen: str, k: int, tokens_list: list[int], gen: torch.Generator) -> list[dict]:
    n_exp, top_k, hidden, inter = SCENARIOS[scen]
    cb = normal_float_codebook(k).cuda()
    w16 = {"w13": torch.randn(n_exp, 2 * inter, hidden, device="cuda", dtype=torch.float16) * 0.05,
           "w2": torch.randn(n_exp, hidden, inter, device="cuda", dtype=torch.float16) * 0.05}
    tiled = []
    for name in ("w13", "w2"):
        tiled += list(kbit_repack_experts(*kbit_quantize_experts(w16[name].float(), cb, k, name), k))
    copies = [tuple(t.clone() for t in tiled) for _ in range(COPIES)]
    rows = []
    for t in tokens_list:
        routes = [routing(n_exp, top_k, t, gen) for _ in range(COPIES)]
        x = torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16)
        r = {"scenario": scen, "k": k, "tokens": t, "pairs": t * top_k,
             "default": "fused" if dispatch.moe_fused(t * top_k, n_exp) else "unfused"}
        for path in ("fused", "unfused"):
            r[path] = time_graph([(lambda c=c, w=w, ids=ids, p=path, x=x: moe_experts_path(
                x, ids, w, None, *c, cb, k, "silu", path=p)) for c, (w, ids) in zip(copies, routes, strict=True)])
        calls = []
        for _, ids in routes:  # fp16 bmm over the active experts, rows padded to the busiest
            active, counts = torch.unique(ids.flatten(), return_counts=True)
            maxc = int(counts.max())
            w13a, w2a = w16["w13"][active].clone(), w16["w2"][active].clone()
            xa = torch.randn(len(active), maxc, hidden, device="cuda", dtype=torch.float16)
            ha = torch.randn(len(active), maxc, inter, device="cuda", dtype=torch.float16)
            calls.append(lambda w13a=w13a, w2a=w2a, xa=xa, ha=ha: (torch.bmm(xa, w13a.transpose(1, 2)),
                                                                   torch.bmm(ha, w2a.transpose(1, 2))))
        r["fp16_bmm"] = time_graph(calls)
        del calls
        torch.cuda.empty_cache()
        rows.append(r)
        print(f"| {scen} | {k} | {t} | {r['pairs']} | {r['fused']:.1f} | {r['unfused']:.1f} | {r['fp16_bmm']:.1f} | "
              f"{r['fp16_bmm'] / r['fused']:.2f}x | {r['fp16_bmm'] / r['unfused']:.2f}x | {r['default']} |", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ks", default="4")
    ap.add_argument("--tokens", default="1,2,4,8,16")
    ap.add_argument("--scenarios", default="qwen128,seed8")
    args = ap.parse_args()
    start_run()
    gen = torch.Generator().manual_seed(0)
    print("\n| scenario | k | tokens | pairs | one kernel µs | five ops µs | fp16 bmm µs | fp16 / one kernel | "
          "fp16 / five ops | op's path |")
    print("|---" * 10 + "|")
    for scen in args.scenarios.split(","):
        for k in (int(v) for v in args.ks.split(",")):
            bench(scen, k, [int(v) for v in args.tokens.split(",")], gen)


if __name__ == "__main__":
    main()
