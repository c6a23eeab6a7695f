"""Issue 3 experiment (M >= 256): the dense kbit wgmma kernel at each of its row tiles past 64 rows
(64, 128 and the tall tiles), forced, beside the op, dequantize + cuBLAS and cuBLAS bf16; with --awq,
awq_orin's dense wgmma kernel (group 128) the same way.

Row tile costs in 64-row tiles (dispatch.WGMMA_WIDE_TILE_COST, WGMMA_TALL_TILES) are read off
these tables. Timed as bench_kbit.py times (CUDA-graph replay of rotated weight copies, behind a
writer of x), bf16.

Usage (GPU, repo root): python benchmarks/exp_wgmma_rows.py [--k 4 2] [--m 128 256 ..] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kbit_vllm import ops
from kbit_vllm.backends.cuda import awq_ops, dispatch
from kbit_vllm.backends.cuda import ops as cuda_ops
from kbit_vllm.formats import normal_float_codebook, quantize_awq_rtn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kbit as bk  # noqa: E402

SHAPES = [("l3_gateup", 4096, 28672), ("l3_down", 14336, 4096), ("l3_qkv", 4096, 6144), ("l3_o", 4096, 4096)]
MS = [128, 192, 256, 384, 512, 768, 1024]
ROWS = [64, 128, *sorted(dispatch.WGMMA_TALL_TILES)]
AWQ_GROUP = 128


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-30))


def sweep(label: str, shape: tuple[str, int, int], k: int | str, ms: list[int], rows_list: list[int],
          w: torch.Tensor, copies: list, op, path, op_rows, chooser: tuple[object, str], forced) -> list[dict]:
    """Times, per M, cuBLAS bf16 on w, the dispatched op(x, copy) (its row tile op_rows(M)),
    path(x, copy, "dequant") and path(x, copy, "wgmma") with module.attr (chooser) replaced by
    forced(rows) for each row tile, and prints one line per M; the wgmma outputs are checked against
    dequantize + cuBLAS."""
    name, in_f, out_f = shape
    module, attr = chooser
    choose = getattr(module, attr)
    w16 = [w.clone() for _ in range(bk.n_copies(w.numel() * 2))]
    out = []
    for m in ms:
        x = torch.randn(m, in_f, device="cuda", dtype=torch.bfloat16)
        ref = path(x, copies[0], "dequant")
        r = {"shape": name, "in": in_f, "out": out_f, "k": k, "M": m, "op_rows": op_rows(m)}
        r["cublas"] = bk.timed([(lambda wc=wc, x=x: F.linear(x, wc)) for wc in w16], x)
        r["op"] = bk.timed([(lambda c=c, x=x: op(x, c)) for c in copies], x)
        r["dequant"] = bk.timed([(lambda c=c, x=x: path(x, c, "dequant")) for c in copies], x)
        for rows in rows_list:
            setattr(module, attr, forced(rows))
            try:
                r[f"r{rows}"] = bk.timed([(lambda c=c, x=x: path(x, c, "wgmma")) for c in copies], x)
                r[f"err_r{rows}"] = rel_err(path(x, copies[0], "wgmma"), ref)
            finally:
                setattr(module, attr, choose)
        out.append(r)
        cells = " ".join(f"{key}={v:.1f}" for key, v in r.items() if isinstance(v, float) and not key.startswith("err"))
        errs = " ".join(f"{key}={v:.1e}" for key, v in r.items() if key.startswith("err"))
        print(f"{name} {in_f}x{out_f} {label} M={m} (op rows {r['op_rows']}): {cells} | {errs}", flush=True)
    del copies, w16
    torch.cuda.empty_cache()
    return out


def run_awq_shape(name: str, in_f: int, out_f: int, ms: list[int], rows_list: list[int]) -> list[dict]:
    """awq_orin's dense wgmma kernel (group 128) forced to each row tile beside its op and cuBLAS."""
    w = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) * 0.05
    qw, qz, s = quantize_awq_rtn(w, AWQ_GROUP, scale_dtype=torch.bfloat16)
    wq, sz = ops.awq_repack(qw, qz, s, AWQ_GROUP, torch.bfloat16)
    copies = [(wq.clone(), sz.clone()) for _ in range(bk.n_copies(wq.numel() * 4 + sz.numel() * 2))]
    return sweep(f"awq g{AWQ_GROUP}", (name, in_f, out_f), "awq", ms, rows_list, w, copies,
                 lambda x, c: ops.awq_linear(x, c[0], c[1], None, AWQ_GROUP, out_f),
                 lambda x, c, p: awq_ops.linear_path(x, c[0], c[1], None, AWQ_GROUP, out_f, p),
                 lambda m: awq_ops.wgmma_rows(m, (9, 0), out_f * in_f),
                 (awq_ops, "wgmma_rows"), lambda rows: (lambda m, capability, weights: rows))


def run_shape(name: str, in_f: int, out_f: int, k: int, ms: list[int], rows_list: list[int]) -> list[dict]:
    """The kbit dense wgmma kernel at k bits forced to each row tile beside its op and cuBLAS."""
    w = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) * 0.05
    cb = normal_float_codebook(k).cuda()
    pt, at = ops.kbit_repack(*ops.kbit_quantize(w, cb, k), k)
    copies = [(pt.clone(), at.clone()) for _ in range(bk.n_copies(pt.numel() * 4 + at.numel()))]
    return sweep(f"k={k}", (name, in_f, out_f), k, ms, rows_list, w, copies,
                 lambda x, c: ops.kbit_linear(x, c[0], c[1], cb, None, k, out_f),
                 lambda x, c, p: cuda_ops.linear_path(x, c[0], c[1], cb, None, k, out_f, p),
                 lambda m: dispatch.wgmma_dense_rows(m, (9, 0), out_f * in_f, k),
                 (dispatch, "wgmma_dense_rows"), lambda rows: (lambda m, capability, weights, k: rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[4])
    ap.add_argument("--m", type=int, nargs="+", default=MS)
    ap.add_argument("--rows", type=int, nargs="+", default=ROWS, help="row tiles to force")
    ap.add_argument("--shapes", nargs="+", default=[s[0] for s in SHAPES])
    ap.add_argument("--awq", action="store_true", help="awq_orin's wgmma kernel (group 128) instead of kbit's")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    bk.BEHIND_WRITER = True
    bk.start_run()
    print("# µs per call, bf16, behind a writer; r{rows}: the wgmma kernel forced to that row tile")
    out = []
    for name, in_f, out_f in SHAPES:
        if name not in args.shapes:
            continue
        if args.awq:
            out += run_awq_shape(name, in_f, out_f, args.m, args.rows)
            continue
        for k in args.k:
            out += run_shape(name, in_f, out_f, k, args.m, args.rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
