"""A dense decoder's linears in a decode step, as vLLM runs them, timed as DESIGN.md says.

bench_kbit.py times one linear at a time (behind a writer of x with --behind-writer). In vLLM each
step runs a chain per layer: norm -> qkv -> attention -> o -> norm -> gate_up -> activation ->
down, with vLLM's kernels (no PDL) between ours. This builds that chain for Llama-3-8B shapes over
LAYERS layers of distinct weights (so no layer's weights are in L2 when it runs), in one CUDA
graph: `torch.mul` stands in for each kernel that writes a linear's x and `torch.cuda._sleep` for
attention (DRAM idle). Per layer: the chain with our linears (kbit_vllm::kbit_linear, the op's
own dispatch), with cuBLAS bf16 linears, and with no linears at all ("glue"); the linears' share
of a layer is the chain minus the glue. Median of replays.

Usage (GPU machine, repo root): python benchmarks/bench_dense_layer.py [--ms 1,16] [--ks 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kbit import start_run, time_graph  # noqa: E402

from kbit_vllm import normal_float_codebook, ops  # noqa: E402

HIDDEN, QKV, INTER = 4096, 6144, 14336
SHAPES = (("qkv", HIDDEN, QKV), ("o", HIDDEN, HIDDEN), ("gate_up", HIDDEN, 2 * INTER), ("down", INTER, HIDDEN))
ATTN_SLEEP_CYCLES = 20000  # ~10 µs at 2 GHz: batch-1 attention of a short context in vLLM (~11 µs)


def kbit_layers(k: int, layers: int) -> list[dict]:
    """`layers` copies of one quantization per shape (cloned: distinct memory, same values)."""
    cb = normal_float_codebook(k).cuda()
    base = {}
    for name, fin, fout in SHAPES:
        w = torch.randn(fout, fin, device="cuda", dtype=torch.float16) * 0.02
        base[name] = (*ops.kbit_repack(*ops.kbit_quantize(w, cb, k), k), fout)
        del w
    return [{name: (pt.clone(), at.clone(), cb.clone(), fout) for name, (pt, at, fout) in base.items()}
            for _ in range(layers)]


def bf16_layers(layers: int) -> list[dict]:
    return [{name: torch.randn(fout, fin, device="cuda", dtype=torch.bfloat16) * 0.02 for name, fin, fout in SHAPES}
            for _ in range(layers)]


def chain(layers: list[dict], m: int, linear) -> list:
    """One call per layer: the layer's writers, attention stand-in and four linears."""
    xs = {name: torch.randn(m, fin, device="cuda", dtype=torch.bfloat16) * 0.1 for name, fin, _ in SHAPES}
    src = {name: torch.randn(m, fin, device="cuda", dtype=torch.bfloat16) * 0.1 for name, fin, _ in SHAPES}

    def call(lay: dict):
        def run() -> None:
            for name, _, _ in SHAPES:
                if name == "o":
                    torch.cuda._sleep(ATTN_SLEEP_CYCLES)
                torch.mul(src[name], 1.0, out=xs[name])
                if linear is not None:
                    linear(xs[name], lay[name])
        return run
    return [call(lay) for lay in layers]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,16", help="rows of x (batch)")
    ap.add_argument("--ks", default="4", help="kbit bits to time")
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args()
    start_run()
    ms = [int(v) for v in args.ms.split(",")]
    ks = [int(v) for v in args.ks.split(",")]
    rows: dict[int, dict[str, float]] = {m: {} for m in ms}
    for m in ms:
        rows[m]["glue"] = time_graph(chain([{}] * args.layers, m, None))
    bl = bf16_layers(args.layers)
    for m in ms:
        rows[m]["bf16"] = time_graph(chain(bl, m, lambda x, w: F.linear(x, w)))
    del bl
    torch.cuda.empty_cache()
    for k in ks:
        kl = kbit_layers(k, args.layers)
        for m in ms:
            rows[m][f"k{k}"] = time_graph(chain(
                kl, m, lambda x, w, k=k: ops.kbit_linear(x, w[0], w[1], w[2], None, k, w[3])))
        del kl
        torch.cuda.empty_cache()
    names = ["bf16"] + [f"k{k}" for k in ks]
    print(f"\n| M | glue | {' | '.join(f'{n} layer / linears' for n in names)} | "
          f"{' | '.join(f'k{k} linears vs bf16' for k in ks)} |  (µs per Llama-3-8B layer, bf16 x, "
          f"{args.layers} layers)")
    print("|---" * (2 + len(names) + len(ks)) + "|")
    for m in ms:
        r = rows[m]
        lin = {n: r[n] - r["glue"] for n in names}
        print(f"| {m} | {r['glue']:.1f} | " + " | ".join(f"{r[n]:.1f} / {lin[n]:.1f}" for n in names) + " | "
              + " | ".join(f"{lin['bf16'] / lin[f'k{k}']:.2f}x" for k in ks) + " |", flush=True)


if __name__ == "__main__":
    main()
