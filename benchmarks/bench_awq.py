"""awq_orin kernels vs cuBLAS fp16 and torch int4 tinygemm, timed as DESIGN.md says.

Same method as bench_kbit.py (whose timing helpers it uses): CUDA-graph replay over >= 256 MB
of rotated weight copies, median per call. Floor = (int4 weights + fp16 scales + int4 zeros,
the AWQ checkpoint's bytes, + x + y) / measured HBM bandwidth.

GEMV columns: "stream-K" (csrc/awq_gemv_sk.cu, M <= 4), "warp" (csrc/awq_gemv.cu, M <= 8, the
deterministic one) and "tensor core" (csrc/awq_gemv_tc.cu, Hopper, M <= 8); "op" is awq_linear's
own choice between them and the other kernels.

--behind-writer times every call behind a kernel without PDL that writes its x (bench_kbit.py's).

Usage (GPU machine, repo root): python benchmarks/bench_awq.py [--json PATH] [--quick] [--ms 1,4]
    [--dtype bfloat16] [--behind-writer]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kbit  # noqa: E402
from bench_kbit import LLAMA, MS, SEED_DENSE, extra_shapes, fmt, make_tinygemm, n_copies, start_run, timed  # noqa: E402

from kbit_vllm import ops  # noqa: E402
from kbit_vllm.backends.cuda import awq_ops  # noqa: E402
from kbit_vllm.backends.cuda.cargs import SUFFIX  # noqa: E402
from kbit_vllm.backends.cuda.ops import wgmma_ok  # noqa: E402
from kbit_vllm.formats import quantize_awq_rtn  # noqa: E402

GROUP = 128
GEMV_PATHS = ("gemv_sk", "gemv_warp", "gemv_tc")


def bench_shape(name: str, in_f: int, out_f: int, ms: list[int], bw: float, cap: int,
                dt: torch.dtype = torch.float16) -> list[dict]:
    """Our kernels in activation dtype dt beside cuBLAS in the same dtype (and tinygemm, bf16)."""
    w = torch.randn(out_f, in_f, device="cuda", dtype=dt) * 0.05
    qw, qz, s = quantize_awq_rtn(w, GROUP, scale_dtype=dt)
    wq, sz = ops.awq_repack(qw, qz, s, GROUP, dt)
    ckpt_bytes = qw.numel() * 4 + qz.numel() * 4 + s.numel() * 2
    copies = [(wq.clone(), sz.clone()) for _ in range(n_copies(wq.numel() * 4 + sz.numel() * 2, cap))]
    w16 = [w.clone() for _ in range(n_copies(w.numel() * 2, cap))]
    tiny = make_tinygemm(w, len(w16)) if (name, in_f, out_f) in LLAMA else None
    rows = []
    for m in ms:
        x = torch.randn(m, in_f, device="cuda", dtype=dt)
        r: dict = {"shape": name, "in": in_f, "out": out_f, "M": m}
        sk = m <= awq_ops.SK_MAX_M and awq_ops.gemv_sk_units(in_f, out_f) >= awq_ops.SK_WARPS
        wg = ["wgmma"] if wgmma_ok(x.device, 4) else []
        tc = ["gemv_tc"] if awq_ops.gemv_tc_ctas(x.device, SUFFIX[dt], m, in_f, out_f) > 0 else []
        for path in (["gemv_sk"] if sk else []) + (["gemv_warp"] if m <= 8 else []) + tc + ["mma", *wg, "dequant"]:
            try:
                r[path] = timed([
                    (lambda c=c, p=path, x=x: awq_ops.linear_path(x, c[0], c[1], None, GROUP, out_f, p))
                    for c in copies], x)
            except Exception as e:  # report, keep going
                print(f"# {name} M={m} {path} failed: {e}", file=sys.stderr)
        r["op"] = timed([(lambda c=c, x=x: ops.awq_linear(x, c[0], c[1], None, GROUP, out_f)) for c in copies], x)
        r["cublas_fp16"] = timed([(lambda wc=wc, x=x: F.linear(x, wc)) for wc in w16], x)
        if tiny is not None and m in (1, 8, 16):
            xb = x.to(torch.bfloat16)
            r["tinygemm_int4"] = timed([(lambda q=q, xb=xb: torch._weight_int4pack_mm(xb, q[0], 128, q[1]))
                                        for q in tiny], xb)
        r["floor"] = (ckpt_bytes + 2 * m * (in_f + out_f)) / bw * 1e6
        rows.append(r)
    del copies, w16, tiny
    torch.cuda.empty_cache()
    return rows


def print_tables(rows: list[dict], dtype: str = "fp16") -> None:
    for m in sorted({r["M"] for r in rows}):
        print(f"\n### awq_orin, M = {m} (µs per call, group {GROUP}, {dtype})\n")
        print(f"| shape (in x out) | gemv (stream-K) | gemv (warp) | gemv (tensor core) | mma | wgmma | "
              f"dequant+cuBLAS | op | cuBLAS {dtype} | tinygemm int4 | best | vs cuBLAS | vs tinygemm | floor | "
              "best/floor |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in (r for r in rows if r["M"] == m):
            best = min(r[p] for p in (*GEMV_PATHS, "mma", "wgmma", "dequant") if p in r)
            tg = r.get("tinygemm_int4")
            print(f"| {r['shape']} {r['in']}x{r['out']} | {fmt(r.get('gemv_sk'))} | {fmt(r.get('gemv_warp'))} | "
                  f"{fmt(r.get('gemv_tc'))} | {fmt(r.get('mma'))} | {fmt(r.get('wgmma'))} | {fmt(r.get('dequant'))} | "
                  f"{fmt(r['op'])} | "
                  f"{fmt(r['cublas_fp16'])} | {fmt(tg)} | {best:.1f} | {r['cublas_fp16'] / best:.2f}x | "
                  f"{'-' if tg is None else f'{tg / best:.2f}x'} | {r['floor']:.1f} | {best / r['floor']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="bench_awq.json")
    ap.add_argument("--quick", action="store_true", help="fewer weight copies")
    ap.add_argument("--ms", default=None)
    ap.add_argument("--shapes", default=None, help="comma-separated shape names (default all)")
    ap.add_argument("--extra", default="", help="more layers as comma-separated INxOUT (bench_kbit.py --extra)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"),
                    help="activation dtype (cuBLAS runs in the same dtype)")
    ap.add_argument("--behind-writer", action="store_true",
                    help="time every call behind a kernel without PDL that writes x, as in vLLM (bench_kbit.py)")
    args = ap.parse_args()
    bench_kbit.BEHIND_WRITER = args.behind_writer
    dt = getattr(torch, args.dtype)
    bw, dev = start_run()
    ms = [int(v) for v in args.ms.split(",")] if args.ms else MS
    rows: list[dict] = []
    t0 = time.time()
    extra = extra_shapes(args.extra)
    for name, in_f, out_f in SEED_DENSE + LLAMA + extra:
        if args.shapes and name not in args.shapes.split(",") + [n for n, _, _ in extra]:
            continue
        rows += bench_shape(name, in_f, out_f, ms, bw, 64 if args.quick else 400, dt)
        print(f"# {name} done at {time.time() - t0:.0f}s", flush=True)
    print_tables(rows, "fp16" if dt == torch.float16 else "bf16")
    with open(args.json, "w") as f:
        json.dump({"device": dev, "hbm_bytes_per_s": bw, "group": GROUP, "dtype": args.dtype, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
