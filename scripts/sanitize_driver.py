"""Calls every CUDA kernel family once on small shapes, for compute-sanitizer (scripts/sanitize.sh).

dense kbit: quantize (fp16/bf16/fp32), dequantize, repack, unrepack, GEMV (stream-K and cluster),
MMA (split-K and not), tiled dequant + cuBLAS; awq: repack, GEMV (stream-K, warp), MMA, dequant; grouped
kbit: stream-K GEMV, slot GEMV, MMA (bm 16 / 64, split-K, deterministic and not); grouped awq:
GEMV, MMA; the fused kbit MoE experts kernel. Both activation dtypes. Outputs are compared with the
PyTorch path loosely (a crash or garbage fails the run, precision is the fuzz sweep's job). Prints
one line per call.

`python3 scripts/sanitize_driver.py [FAMILY ...]` runs only the named families (FAMILIES; the
setup kernels, quantize and repack, always run), so a sanitizer that aborts on one family
does not hide the others: scripts/sanitize.sh runs each family in its own process.
"""

from __future__ import annotations

import os
import sys

import torch

from kbit_vllm import normal_float_codebook, ops
from kbit_vllm.backends import reference as ref
from kbit_vllm.backends.cuda import awq_ops, library
from kbit_vllm.backends.cuda import ops as cops
from kbit_vllm.backends.cuda.moe_experts import moe_experts_path
from kbit_vllm.formats import quantize_awq_rtn
from kbit_vllm.layers.moe_compute import kbit_quantize_experts, kbit_repack_experts

DEV = "cuda"
FAIL: list[str] = []
FAMILIES = ("kbit_formats", "kbit_gemv", "kbit_mma", "kbit_dequant", "awq", "kbit_grouped", "awq_grouped",
            "kbit_moe_experts")
ONLY: set[str] = set(FAMILIES)


def _family(path: str) -> str:
    """The family of a dense kbit path name."""
    if path.startswith("gemv"):
        return "kbit_gemv"
    return "kbit_mma" if path.startswith(("mma", "wgmma")) else "kbit_dequant"


def check(name: str, y: torch.Tensor, want: torch.Tensor, tol: float = 5e-2) -> None:
    torch.cuda.synchronize()
    err = float((y.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6))
    ok = bool(torch.isfinite(y).all()) and err < tol
    print(f"{'ok  ' if ok else 'FAIL'} {name}: rel err {err:.2e}", flush=True)
    if not ok:
        FAIL.append(name)


def kbit(dtype: torch.dtype) -> None:
    g = torch.Generator(device="cpu").manual_seed(0)
    k, out_f, in_f = 4, 256, 1024  # 2 tiles x 32 blocks: stream-K has units, MMA splits K
    w = (torch.randn(out_f, in_f, generator=g)).to(DEV)
    cb = normal_float_codebook(k, DEV)
    for wd in (torch.float16, torch.bfloat16, torch.float32):
        p, a = ops.kbit_quantize(w.to(wd), cb, k)
        torch.cuda.synchronize()
        print(f"ok   kbit_quantize {wd}", flush=True)
    p, a = ops.kbit_quantize(w.to(dtype), cb, k)
    if "kbit_formats" in ONLY:
        wd = ops.kbit_dequantize(p, a, cb, k, dtype)
        check(f"kbit_dequantize {dtype}", wd, ref.kbit_dequantize(p, a, cb, k, dtype))
    pt, at = ops.kbit_repack(p, a, k)
    if "kbit_formats" in ONLY:
        p2, a2 = ops.kbit_unrepack(pt, at, k, out_f)
        torch.cuda.synchronize()
        assert torch.equal(p2, p) and torch.equal(a2, a), "repack/unrepack round trip"
        print("ok   kbit_repack / kbit_unrepack", flush=True)
    for m, paths in ((1, ("gemv_sk", "gemv_cluster", "gemv_rows8", "gemv_rows32")), (3, ("gemv_sk", "gemv_cluster")),
                     (16, ("mma",)),
                     (40, ("mma", "wgmma_ck")), (64, ("dequant",))):
        x = torch.randn(m, in_f, generator=g).to(dtype).to(DEV)
        bias = torch.randn(out_f, generator=g).to(dtype).to(DEV)
        want = ref.kbit_linear(x.float(), pt, at, cb, bias.float(), k, out_f)
        for path in (p for p in paths if _family(p) in ONLY):
            if path.startswith("wgmma") and not cops.path_ok(torch.device(DEV), path, k, m):
                continue  # the Hopper kernels (sm_90a)
            for det in ("0", "1") if path == "mma" else ("0",):  # deterministic mode: per-CTA slots
                os.environ["KBIT_VLLM_DETERMINISTIC"] = det
                check(f"kbit_linear {path} m={m} det={det} {dtype}",
                      cops.linear_path(x, pt, at, cb, bias, k, out_f, path), want)
            os.environ["KBIT_VLLM_DETERMINISTIC"] = "0"
    if "kbit_gemv" in ONLY:  # the row-slice GEMV's four-block batches (k = 3, 4 from 96 input blocks): 129
        # blocks give a 32-row slice's lane groups two batches, the last one partial
        w4 = torch.randn(64, 4128, generator=g).to(DEV)
        pt4, at4 = ops.kbit_repack(*ops.kbit_quantize(w4.to(dtype), cb, k), k)
        x4 = torch.randn(1, 4128, generator=g).to(dtype).to(DEV)
        want4 = ref.kbit_linear(x4.float(), pt4, at4, cb, None, k, 64)
        for path in ("gemv_rows8", "gemv_rows32"):
            check(f"kbit_linear {path} in=4128 (four-block batches) {dtype}",
                  cops.linear_path(x4, pt4, at4, cb, None, k, 64, path), want4)
    # k = 5: the shuffle GEMV with a padded last tile, and the MMA without split-K (4 blocks of K)
    cb5 = normal_float_codebook(5, DEV)
    for m, path, rows, cols in ((2, "gemv", 200, in_f), (16, "mma", 200, 128)):
        if _family(path) not in ONLY:
            continue
        p5, a5 = ops.kbit_quantize(w[:rows, :cols].to(dtype), cb5, 5)
        pt5, at5 = ops.kbit_repack(p5, a5, 5)
        x = torch.randn(m, cols, generator=g).to(dtype).to(DEV)
        check(f"kbit_linear {path} k=5 in={cols} out={rows} {dtype}",
              cops.linear_path(x, pt5, at5, cb5, None, 5, rows, path),
              ref.kbit_linear(x.float(), pt5, at5, cb5, None, 5, rows))


def grouped(dtype: torch.dtype) -> None:
    g = torch.Generator(device="cpu").manual_seed(1)
    k, n_exp, out_f, in_f = 4, 4, 256, 512
    cb = normal_float_codebook(k, DEV)
    pts, ats, awqs = [], [], []
    for _ in range(n_exp):
        w = torch.randn(out_f, in_f, generator=g).to(DEV)
        p, a = ops.kbit_quantize(w, cb, k)
        pt, at = ops.kbit_repack(p, a, k)
        pts.append(pt), ats.append(at)
        awqs.append(ops.awq_repack(*[t.to(DEV) for t in quantize_awq_rtn(w.cpu(), 64)], 64, dtype))
    pt, at = torch.stack(pts), torch.stack(ats)
    wq, sz = torch.stack([a[0] for a in awqs]), torch.stack([a[1] for a in awqs])
    for rows, counts in ((4, (1, 0, 2, 1)), (64, (30, 0, 20, 14))):
        offs = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
        x = torch.randn(rows, in_f, generator=g).to(dtype).to(DEV)
        want = ref.kbit_grouped_linear(x.float(), pt, at, cb, offs, k, out_f)
        for det in ("0", "1") if "kbit_grouped" in ONLY else ():
            os.environ["KBIT_VLLM_DETERMINISTIC"] = det
            for path, bm in (("gemv", None), ("gemv_slot", None), ("mma", 16), ("mma", 64)):
                check(f"kbit_grouped {path} bm={bm} rows={rows} det={det} {dtype}",
                      cops.grouped_path(x, pt, at, cb, offs, k, out_f, path, bm), want)
        os.environ["KBIT_VLLM_DETERMINISTIC"] = "0"
        o = offs.tolist()
        want_awq = torch.cat([awq_ops.awq_linear(x[o[e]:o[e + 1]].float(), wq[e], sz[e].float(), None, 64, out_f)
                              for e in range(n_exp)])
        for path, bm in (("gemv", None), ("mma", 16), ("mma", 64)) if "awq_grouped" in ONLY else ():
            check(f"awq_grouped {path} bm={bm} rows={rows} {dtype}",
                  awq_ops.grouped_path(x, wq, sz, offs, 64, out_f, path, bm), want_awq)


def fused_moe(dtype: torch.dtype) -> None:
    """The fused MoE experts kernel (two phases, ready flags) against the five ops, one token and three."""
    g = torch.Generator(device="cpu").manual_seed(3)
    k, n_exp, hidden, inter, top_k = 4, 8, 256, 128, 4
    cb = normal_float_codebook(k, DEV)
    tiled = []
    for name, (o, i) in (("w13", (2 * inter, hidden)), ("w2", (hidden, inter))):
        w = torch.randn(n_exp, o, i, generator=g).to(DEV) * 0.05
        tiled += kbit_repack_experts(*kbit_quantize_experts(w, cb, k, name), k)
    for tokens in (1, 3):
        x = torch.randn(tokens, hidden, generator=g).to(dtype).to(DEV)
        w, ids = torch.topk(torch.softmax(torch.randn(tokens, n_exp, generator=g), -1), top_k, dim=-1)
        args = (x, ids.to(torch.int32).to(DEV), w.to(DEV), None, *tiled, cb, k, "silu")
        check(f"kbit_moe_experts fused tokens={tokens} {dtype}", moe_experts_path(*args, path="fused"),
              moe_experts_path(*args, path="unfused"))


def awq(dtype: torch.dtype) -> None:
    g = torch.Generator(device="cpu").manual_seed(2)
    out_f, in_f, gs = 256, 1024, 128
    qw, qz, sc = (t.to(DEV) for t in quantize_awq_rtn(torch.randn(out_f, in_f, generator=g), gs))
    wq, sz = ops.awq_repack(qw, qz, sc, gs, dtype)
    w = ops.awq_dequantize(qw, qz, sc, gs).to(torch.float32)
    for m, path in ((1, "gemv_sk"), (3, "gemv_sk"), (1, "gemv"), (5, "gemv"), (16, "mma"), (48, "mma"),
                    (100, "dequant")):
        x = torch.randn(m, in_f, generator=g).to(dtype).to(DEV)
        bias = torch.randn(out_f, generator=g).to(dtype).to(DEV)
        check(f"awq_linear {path} m={m} {dtype}", awq_ops.linear_path(x, wq, sz, bias, gs, out_f, path),
              x.float() @ w.t() + bias.float())


def main() -> int:
    ok, why = library.device_supported(torch.cuda.current_device())
    if not ok:
        print(f"CUDA kernels unavailable: {why}")
        return 2
    unknown = set(sys.argv[1:]) - set(FAMILIES)
    if unknown:
        print(f"unknown families {sorted(unknown)}; choose from {FAMILIES}")
        return 2
    if sys.argv[1:]:
        ONLY.intersection_update(sys.argv[1:])
    for dtype in (torch.float16, torch.bfloat16):
        if ONLY & {"kbit_formats", "kbit_gemv", "kbit_mma", "kbit_dequant"}:
            kbit(dtype)
        if "awq" in ONLY:
            awq(dtype)
        if ONLY & {"kbit_grouped", "awq_grouped"}:
            grouped(dtype)
        if "kbit_moe_experts" in ONLY:
            fused_moe(dtype)
    torch.cuda.synchronize()
    print(f"driver done, {len(FAIL)} failed checks: {FAIL}")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
