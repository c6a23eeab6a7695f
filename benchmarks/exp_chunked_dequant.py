"""Experiment for issue 3 (M >= 256): dequantize + cuBLAS a few tiles at a time, so that the bf16
weights live only in L2, beside the op (the wgmma kernel at these M) and cuBLAS bf16.

The whole-layer dequant + cuBLAS path writes and rereads every bf16 weight through HBM (4096x28672
k=4 at M=256: 172 µs against the wgmma kernel's 127 and cuBLAS's 97, RESULTS.md session 29). Here
each chunk of C tiles (128 rows each) is dequantized into a buffer that L2 can hold and multiplied
at once, so HBM carries the packed weights only:
- dq_only{C}: the chunks' dequantization alone (what the decode costs when its writes stay in L2);
- mm_only{C}: the chunks' GEMMs alone, on one L2-resident buffer (cuBLAS reading weights from L2);
- chunk{C}: dequantize, multiply, next chunk, on one stream and one buffer;
- overlap{C}: two buffers, chunk i + 1 dequantized on a side stream while cuBLAS runs chunk i.
Output is y^T [out, M] (each chunk's rows contiguous); checked against the dequant path's y.
Timed as bench_kbit.py times (CUDA-graph replay of rotated weight copies, behind a writer of x).

Usage (GPU, repo root): python benchmarks/exp_chunked_dequant.py [--k 4 5] [--json PATH]
Written in session 31 without a GPU (its chunk bookkeeping checked on CPU); its first GPU run decides
whether a chunked path earns a place in the op.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kbit_vllm import ops
from kbit_vllm.backends.cuda import ops as cuda_ops
from kbit_vllm.backends.cuda.cargs import cint, ptr, stream
from kbit_vllm.backends.cuda.library import LIB, check
from kbit_vllm.formats import TILE_N, normal_float_codebook

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kbit as bk  # noqa: E402

SHAPES = [("l3_gateup", 4096, 28672), ("l3_down", 14336, 4096), ("l3_qkv", 4096, 6144), ("l3_o", 4096, 4096)]
MS = [256, 512, 1024]
CHUNK_MB = [8, 16, 32]


def dequant_into(w: torch.Tensor, pt: torch.Tensor, at: torch.Tensor, cb: torch.Tensor, k: int, rows: int) -> None:
    """bf16 rows of tiles pt / at into w[:rows] on the current stream."""
    check(LIB.kbit_vllm_dequantize_tiled_bf16(ptr(pt), ptr(at), ptr(cb), cint(k), cint(rows), cint(at.shape[1]),
                                              ptr(w), stream(w.device)), "exp dequant")


def chunks(out_f: int, c: int) -> list[tuple[int, int, int]]:
    """(first tile, first row, rows) of each chunk of c tiles."""
    nt = -(-out_f // TILE_N)
    return [(t0, t0 * TILE_N, min(out_f, (t0 + c) * TILE_N) - t0 * TILE_N) for t0 in range(0, nt, c)]


class Chunked:
    """The chunked variants for one layer shape and chunk size; buffers made once."""

    def __init__(self, in_f: int, out_f: int, m: int, c: int) -> None:
        self.out_f, self.c = out_f, c
        self.parts = chunks(out_f, c)
        self.bufs = [torch.zeros((c * TILE_N, in_f), dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        self.yt = torch.empty((out_f, m), dtype=torch.bfloat16, device="cuda")
        self.side = torch.cuda.Stream()
        n = len(self.parts)
        self.ready = [torch.cuda.Event() for _ in range(n)]
        self.free = [torch.cuda.Event() for _ in range(n)]

    def dq_only(self, pt, at, cb, k, x) -> None:
        for t0, _, rows in self.parts:
            dequant_into(self.bufs[0], pt[t0:t0 + self.c], at[t0:t0 + self.c], cb, k, rows)

    def mm_only(self, pt, at, cb, k, x) -> None:
        for _, r0, rows in self.parts:
            torch.mm(self.bufs[0][:rows], x.t(), out=self.yt[r0:r0 + rows])

    def chunk(self, pt, at, cb, k, x) -> None:
        for t0, r0, rows in self.parts:
            dequant_into(self.bufs[0], pt[t0:t0 + self.c], at[t0:t0 + self.c], cb, k, rows)
            torch.mm(self.bufs[0][:rows], x.t(), out=self.yt[r0:r0 + rows])

    def overlap(self, pt, at, cb, k, x) -> None:
        main = torch.cuda.current_stream()
        self.side.wait_stream(main)

        def produce(i: int) -> None:
            t0, _, rows = self.parts[i]
            with torch.cuda.stream(self.side):
                if i >= 2:
                    self.side.wait_event(self.free[i - 2])  # the GEMM two chunks back read this buffer
                dequant_into(self.bufs[i % 2], pt[t0:t0 + self.c], at[t0:t0 + self.c], cb, k, rows)
                self.ready[i].record(self.side)

        produce(0)
        for i, (_, r0, rows) in enumerate(self.parts):
            if i + 1 < len(self.parts):
                produce(i + 1)
            main.wait_event(self.ready[i])
            torch.mm(self.bufs[i % 2][:rows], x.t(), out=self.yt[r0:r0 + rows])
            self.free[i].record(main)
        main.wait_stream(self.side)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-30))


def run_shape(name: str, in_f: int, out_f: int, k: int, ms: list[int]) -> list[dict]:
    rows = []
    w = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) * 0.05
    cb = normal_float_codebook(k).cuda()
    pt, at = ops.kbit_repack(*ops.kbit_quantize(w, cb, k), k)
    copies = [(pt.clone(), at.clone()) for _ in range(bk.n_copies(pt.numel() * 4 + at.numel()))]
    w16 = [w.clone() for _ in range(bk.n_copies(w.numel() * 2))]
    tile_mb = TILE_N * in_f * 2 / 2**20
    for m in ms:
        x = torch.randn(m, in_f, device="cuda", dtype=torch.bfloat16)
        ref = cuda_ops.linear_path(x, pt, at, cb, None, k, out_f, "dequant")
        r = {"shape": name, "in": in_f, "out": out_f, "k": k, "M": m}
        r["cublas"] = bk.timed([(lambda wc=wc, x=x: F.linear(x, wc)) for wc in w16], x)
        r["op"] = bk.timed([(lambda c=c, x=x: ops.kbit_linear(x, c[0], c[1], cb, None, k, out_f)) for c in copies], x)
        r["dequant"] = bk.timed([(lambda c=c, x=x: cuda_ops.linear_path(x, c[0], c[1], cb, None, k, out_f, "dequant"))
                                 for c in copies], x)
        r["err_op"] = rel_err(ops.kbit_linear(x, pt, at, cb, None, k, out_f), ref)
        for mb in CHUNK_MB:
            c = max(1, round(mb / tile_mb))
            ch = Chunked(in_f, out_f, m, c)
            for variant in ("dq_only", "mm_only", "chunk", "overlap"):
                fn = getattr(ch, variant)
                key = f"{variant}{mb}"
                try:
                    r[key] = bk.timed([(lambda c_=c_, fn=fn, x=x: fn(c_[0], c_[1], cb, k, x)) for c_ in copies], x)
                    if variant in ("chunk", "overlap"):
                        ch.yt.fill_(float("nan"))
                        fn(pt, at, cb, k, x)
                        torch.cuda.synchronize()
                        r[f"err_{key}"] = rel_err(ch.yt.t(), ref)
                except Exception as e:  # report, keep going
                    print(f"# {name} k={k} M={m} {key} failed: {e}", file=sys.stderr)
            del ch
        rows.append(r)
        cells = " ".join(f"{key}={v:.1f}" for key, v in r.items() if isinstance(v, float) and not key.startswith("err"))
        errs = " ".join(f"{key}={v:.1e}" for key, v in r.items() if key.startswith("err"))
        print(f"{name} {in_f}x{out_f} k={k} M={m}: {cells} | {errs}", flush=True)
    del copies, w16
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[4])
    ap.add_argument("--m", type=int, nargs="+", default=MS)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    bk.BEHIND_WRITER = True
    bk.start_run()
    print(f"# L2 {torch.cuda.get_device_properties(0).L2_cache_size / 2**20:.0f} MB; µs per call, bf16, behind a "
          f"writer; chunks of {CHUNK_MB} MB of bf16 weights")
    out = []
    for name, in_f, out_f in SHAPES:
        for k in args.k:
            out += run_shape(name, in_f, out_f, k, args.m)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
