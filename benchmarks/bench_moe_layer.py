"""One whole MoE layer (router + moe_forward) in bf16, as vLLM runs it, timed as DESIGN.md says.

bench_moe.py times the grouped GEMMs alone, back to back; at decode a layer is also its glue
(route, gather, gated activation, combine) and the launch gaps between six kernels that follow a
router of torch kernels (no PDL). This times the layer end to end: router logits, softmax, top-k
and renormalize in torch (vLLM's topkGating stands in), then kbit_vllm's moe_forward with k=4
experts of Qwen3-30B-A3B shapes (128 experts, hidden 2048, intermediate 768, top-8). Variants in
the same run: the layer as shipped (moe_forward with the kbit experts op, kbit_moe_experts: one
kernel at decode); moe_forward's five ops; PDL off (KBIT_VLLM_PDL=0's switch, at run time); the five
ops with routing and gather as two kernels (moe_route, then moe_gather: the glue of session 16,
before the routing CTA copied a decode batch's rows itself).

One CUDA graph calls the layer over LAYERS copies of the expert weights with a routing of their
own each (their active experts exceed the L2); median of replays, per layer.

Usage (GPU machine, repo root): python benchmarks/bench_moe_layer.py [--tokens 1,4,16,64]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kbit import start_run, time_graph  # noqa: E402

from kbit_vllm import normal_float_codebook, ops  # noqa: E402
from kbit_vllm.backends.cuda.library import LIB  # noqa: E402
from kbit_vllm.layers.moe_compute import (  # noqa: E402
    kbit_experts_op,
    kbit_grouped,
    kbit_quantize_experts,
    kbit_repack_experts,
    moe_forward,
)

N_EXP, HIDDEN, INTER, TOP_K, K = 128, 2048, 768, 8, 4
LAYERS = 8  # copies of the experts: 8 x 8 active experts x 2.5 MB at T=1, past the L2


def make_layers() -> list[dict]:
    """LAYERS layers: router weight and the two stacked kbit expert weights (one quantization, cloned)."""
    cb = normal_float_codebook(K).cuda()
    base = {}
    for name, (o, i) in (("w13", (2 * INTER, HIDDEN)), ("w2", (HIDDEN, INTER))):
        w = torch.randn(N_EXP, o, i, device="cuda") * 0.05
        base[name] = (*kbit_repack_experts(*kbit_quantize_experts(w, cb, K, name), K), o)
    layers = []
    for _ in range(LAYERS):
        lay = {"router": torch.randn(N_EXP, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02}
        tiled = {name: (pt.clone(), at.clone()) for name, (pt, at, _) in base.items()}
        for name, (_, _, o) in base.items():
            lay[name] = kbit_grouped(*tiled[name], cb, K, o)
        lay["experts_op"] = kbit_experts_op(*tiled["w13"], *tiled["w2"], cb, K)
        layers.append(lay)
    return layers


def layer_call(lay: dict, x: torch.Tensor, one_op: bool):
    """The layer as vLLM runs it: torch router (no PDL), then moe_forward (one_op: with the experts op,
    kbit_moe_experts, as the kbit FusedMoE method passes it; else the five ops)."""
    def run() -> torch.Tensor:
        probs = torch.softmax((x @ lay["router"].t()).float(), dim=-1)
        w, ids = torch.topk(probs, TOP_K, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        return moe_forward(x, w, ids.to(torch.int32), N_EXP, lay["w13"], lay["w2"], F.silu,
                           experts_op=lay["experts_op"] if one_op else None)
    return run


def route_then_gather(ids, w, n_exp, emap, x):
    """moe_route_gather as two launches."""
    routed = ops.moe_route(ids, w, n_exp, emap)
    return (*routed, ops.moe_gather(x, routed[0]))


@contextlib.contextmanager
def variant(name: str):
    """'ours' as shipped (the experts op), 'five_ops' moe_forward's five ops, 'no_pdl' ours with the PDL
    switch off, 'unfused' the five ops with routing and gather apart."""
    saved = ops.moe_route_gather
    if name == "no_pdl":
        LIB.kbit_vllm_set_pdl(0)
    if name == "unfused":
        ops.moe_route_gather = route_then_gather
    try:
        yield
    finally:
        LIB.kbit_vllm_set_pdl(1)
        ops.moe_route_gather = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,4,16,64")
    ap.add_argument("--variants", default="ours,five_ops,no_pdl,unfused")
    ap.add_argument("--rounds", type=int, default=1, help="times each variant, interleaved (cells: one per round)")
    args = ap.parse_args()
    start_run()
    layers = make_layers()
    names = args.variants.split(",")
    print("\n| tokens | " + " | ".join(names) + " |  (µs per MoE layer, bf16, k=4, Qwen3-30B-A3B shapes)")
    print("|---" * (1 + len(names)) + "|")
    for t in (int(v) for v in args.tokens.split(",")):
        xs = [torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16) for _ in layers]
        cells: dict[str, list[str]] = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                with variant(name):
                    one_op = name in ("ours", "no_pdl")
                    us = time_graph([layer_call(lay, x, one_op) for lay, x in zip(layers, xs, strict=True)])
                cells[name].append(f"{us:.1f}")
        print(f"| {t} | " + " | ".join(" / ".join(cells[n]) for n in names) + " |", flush=True)


if __name__ == "__main__":
    main()
