"""kbit_linear on CPU (the table path, backends/cpu/kbit_tables.py) beside the bf16 matmul.

Times ops.kbit_linear (what vLLM-CPU and transformers call) against F.linear on the same weights
in bf16, and with --reference the PyTorch reference it replaced, on Llama-3-8B layer shapes.
Each cell is the median of --repeats calls after two warm-up calls, in ms, at the machine's
default torch thread count (set --threads to pin it). Quantized weights are random tiled words,
which decode as any real checkpoint does.

Usage (repo root): python benchmarks/bench_cpu_kbit.py [--reference] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from kbit_vllm import ops
from kbit_vllm.backends import reference
from kbit_vllm.formats import TILE_N, normal_float_codebook

# (name, in, out)
SHAPES = [("l3_o", 4096, 4096), ("l3_qkv", 4096, 6144), ("l3_down", 14336, 4096)]
MS = [1, 16, 256]
KS = [2, 3, 4, 5]


def median_ms(fn, fn_args: tuple, repeats: int) -> float:
    fn(*fn_args)
    fn(*fn_args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*fn_args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", action="store_true", help="also time the PyTorch reference (slow) at M=1")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    cpu = platform.processor() or platform.machine()
    print(f"# {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    rows = []
    head = "| shape (in x out) | M | bf16 | " + " | ".join(f"k={k}" for k in KS) + " | k=4 / bf16 |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, in_f, out_f in SHAPES:
        w = torch.randn(out_f, in_f, generator=gen).to(torch.bfloat16)
        layers = {}
        for k in KS:
            nt = -(-out_f // TILE_N)
            packed = torch.randint(-2**31, 2**31 - 1, (nt, in_f // 32, k, TILE_N), generator=gen, dtype=torch.int32)
            absmax = torch.randint(96, 128, (nt, in_f // 32, TILE_N), generator=gen, dtype=torch.uint8)
            layers[k] = (packed, absmax, normal_float_codebook(k))
        for m in MS:
            x = torch.randn(m, in_f, generator=gen).to(torch.bfloat16)
            rec = {"shape": name, "in": in_f, "out": out_f, "m": m,
                   "bf16": median_ms(F.linear, (x, w), args.repeats)}
            for k, (p, a, cb) in layers.items():
                op_args = (x, p, a, cb, None, k, out_f)
                rec[f"k{k}"] = median_ms(ops.kbit_linear, op_args, args.repeats)
                if args.reference and m == 1:
                    rec[f"ref_k{k}"] = median_ms(reference.kbit_linear, op_args, 2)
            cells = " | ".join(f"{rec[f'k{k}']:.1f}" + (f" (ref {rec[f'ref_k{k}']:.0f})" if f"ref_k{k}" in rec else "")
                               for k in KS)
            print(f"| {name} {in_f}x{out_f} | {m} | {rec['bf16']:.1f} | {cells} | {rec['k4'] / rec['bf16']:.1f}x |",
                  flush=True)
            rows.append(rec)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
