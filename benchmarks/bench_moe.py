"""MoE grouped kernels (kbit k=2..5, awq_orin) vs cuBLAS fp16 bmm, timed as DESIGN.md says.

Scenarios (rows = tokens x top-k, sorted by expert; expert offsets live on the device):
  seed8   -- seed 002: 8 experts, every token to all 8; gate 2048x512 and down 512x2048 (in x out).
  qwen128 -- Qwen3-30B-A3B-like: 128 experts, each token to 8 distinct random experts;
             2048x768 and 768x2048.
Tokens 1..1024.

Timing (bench_kbit.time_graph): one CUDA graph calls the op over copies of the stacked expert
weights, enough copies that their *active* experts hold >= 256 MB (the ~60 MB L2 holds none of
them); median of replays, per call. Baselines in the same run: cuBLAS fp16 torch.bmm over the
active experts' weights (pre-gathered, rows padded to the busiest expert: what a framework
without a grouped GEMM runs), and torch._grouped_mm in bf16 (a grouped GEMM with device offsets)
where this torch has it. kbit formats also run the op on bf16 x (op_bf16: what vLLM calls), against
the same fp16 bmm. Floor = (active experts' weight bytes + x + y) / measured HBM bandwidth.

Usage (GPU machine, repo root): python benchmarks/bench_moe.py [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kbit import fmt, start_run, time_graph  # noqa: E402

from kbit_vllm import ops  # noqa: E402
from kbit_vllm.backends.cuda import awq_ops, dispatch  # noqa: E402
from kbit_vllm.backends.cuda import ops as cuda_ops  # noqa: E402
from kbit_vllm.formats import normal_float_codebook, quantize_awq_rtn  # noqa: E402

# (name, experts, top-k, [(shape, in, out)])
SCENARIOS = [
    ("seed8", 8, 8, [("gate", 2048, 512), ("down", 512, 2048)]),
    ("qwen128", 128, 8, [("gate", 2048, 768), ("down", 768, 2048)]),
]
TOKENS = [1, 2, 4, 8, 16, 64, 256, 512, 1024]
FORMATS = ["k2", "k3", "k4", "k5", "awq"]
SWEEP_BM = {"k4": (16, 32, 64, 128), "awq": (16, 32, 64)}  # formats timed at every MMA row tile
SWEEP_MP = {"k4": (1, 2, 3, 4)}  # formats timed at every rows-per-pass of the stream-K GEMV
AWQ_GROUP = 128
ROTATE_BYTES = 256 << 20
COPY_BUDGET = 6 << 30  # bytes of weight copies per format


def route(n_exp: int, topk: int, tokens: int, gen: torch.Generator) -> torch.Tensor:
    """Rows per expert (int64 [E], CPU): every token to top-k distinct experts, uniformly at random."""
    if topk >= n_exp:
        return torch.full((n_exp,), tokens, dtype=torch.int64)
    ids = torch.rand(tokens, n_exp, generator=gen).argsort(dim=1)[:, :topk]
    return torch.bincount(ids.reshape(-1), minlength=n_exp)


def copies_for(active_bytes: int, full_bytes: int) -> int:
    """Copies so the active experts of all copies hold >= ROTATE_BYTES, within COPY_BUDGET."""
    want = math.ceil(ROTATE_BYTES / max(active_bytes, 1))
    return max(2, min(want, COPY_BUDGET // max(full_bytes, 1)))


class Stack:
    """One format's stacked expert weights, copies made on demand, plus a call into the op."""

    def __init__(self, fmt_name: str, w: torch.Tensor) -> None:
        n_exp, out_f, in_f = w.shape
        self.name, self.out_f, self.copies = fmt_name, out_f, []
        if fmt_name == "awq":
            tensors = [ops.awq_repack(*quantize_awq_rtn(w[e], AWQ_GROUP), AWQ_GROUP, torch.float16)
                       for e in range(n_exp)]
            self.base = (torch.stack([t[0] for t in tensors]), torch.stack([t[1] for t in tensors]))
            # the AWQ checkpoint's bytes: int4 weights + fp16 scales + int4 zeros
            self.expert_bytes = out_f * in_f // 2 + (in_f // AWQ_GROUP) * out_f * (2 + 0.5)
        else:
            self.k = int(fmt_name[1:])
            self.cb = normal_float_codebook(self.k).cuda()
            packed, absmax = ops.kbit_quantize(w.reshape(n_exp * out_f, in_f), self.cb, self.k)
            tiles = [ops.kbit_repack(packed[e * out_f:(e + 1) * out_f], absmax[e * out_f:(e + 1) * out_f], self.k)
                     for e in range(n_exp)]
            self.base = (torch.stack([t[0] for t in tiles]), torch.stack([t[1] for t in tiles]))
            self.expert_bytes = self.base[0][0].numel() * 4 + self.base[1][0].numel()
        self.full_bytes = sum(t.numel() * t.element_size() for t in self.base)

    def take(self, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        while len(self.copies) < n:
            self.copies.append(tuple(t.clone() for t in self.base))
        return self.copies[:n]

    def call(self, c, x: torch.Tensor, offs: torch.Tensor, path: str | None, bm: int | None = None,
             mp: int | None = None):
        """A closure running one copy through the op (path None) or one kernel path (bm: the MMA row
        tile, mp: the kbit stream-K GEMV's rows per pass)."""
        if self.name == "awq":
            if path is None:
                return lambda: ops.awq_grouped_linear(x, c[0], c[1], offs, AWQ_GROUP, self.out_f)
            return lambda: awq_ops.grouped_path(x, c[0], c[1], offs, AWQ_GROUP, self.out_f, path, bm=bm)
        if path is None:
            return lambda: ops.kbit_grouped_linear(x, c[0], c[1], self.cb, offs, self.k, self.out_f)
        return lambda: cuda_ops.grouped_path(x, c[0], c[1], self.cb, offs, self.k, self.out_f, path, bm=bm, mp=mp)


def expert_offsets(counts: torch.Tensor) -> torch.Tensor:
    """Device int32 offsets [E + 1] of rows sorted by expert, from rows per expert (CPU)."""
    return torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32).cuda()


def fp16_bmm_time(w16: torch.Tensor, counts: torch.Tensor) -> float:
    """µs of the fp16 baseline: cuBLAS bmm over the active experts' weights, pre-gathered, rows padded
    to the busiest expert, over copies that hold >= ROTATE_BYTES."""
    active = torch.nonzero(counts).flatten()
    wa = w16[active.cuda()]
    wcs = [wa.clone() for _ in range(copies_for(wa.numel() * 2, wa.numel() * 2))]
    xp = torch.randn(len(active), int(counts.max()), w16.shape[2], device="cuda", dtype=torch.float16)
    return time_graph([(lambda wc=wc: torch.bmm(xp, wc.transpose(1, 2))) for wc in wcs])


def grouped_mm_ok(w16: torch.Tensor) -> bool:
    """Whether torch._grouped_mm (bf16, 2-D x 3-D with offsets) runs here and is right."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        n_exp, out_f, in_f = w16.shape
        wb = w16[:2].to(torch.bfloat16)
        x = torch.randn(24, in_f, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor([16, 24], dtype=torch.int32, device="cuda")
        y = torch._grouped_mm(x, wb.transpose(-2, -1), offs=offs)
        want = torch.cat([x[:16] @ wb[0].t(), x[16:] @ wb[1].t()])
        return bool(((y.float() - want.float()).abs().max() / want.float().abs().max()) < 2e-2)
    except Exception as e:  # report, keep going
        print(f"# torch._grouped_mm unavailable: {e}", file=sys.stderr)
        return False


def bench_shape(scen: str, n_exp: int, topk: int, shape: str, in_f: int, out_f: int, formats: list[str],
                tokens_list: list[int], bw: float, gen: torch.Generator) -> list[dict]:
    w16 = torch.randn(n_exp, out_f, in_f, device="cuda", dtype=torch.float16) * 0.05
    use_gmm = grouped_mm_ok(w16)
    routes = {t: route(n_exp, topk, t, gen) for t in tokens_list}
    rows_out: list[dict] = []
    base: dict[int, dict] = {}
    for t, counts in routes.items():  # fp16 baselines and the routing of each token count
        rows = int(counts.sum())
        active = torch.nonzero(counts).flatten()
        a, maxc = len(active), int(counts.max())
        offs = expert_offsets(counts)
        x = torch.randn(rows, in_f, device="cuda", dtype=torch.float16)
        r = {"scenario": scen, "shape": shape, "in": in_f, "out": out_f, "experts": n_exp, "topk": topk,
             "tokens": t, "rows": rows, "active": a, "max_rows": maxc, "x": x, "offs": offs}
        r["fp16_bmm"] = fp16_bmm_time(w16, counts)
        if use_gmm:
            wb = w16.to(torch.bfloat16)
            nc = copies_for(a * out_f * in_f * 2, wb.numel() * 2)
            gcs = [wb.clone() for _ in range(nc)]
            xb = x.to(torch.bfloat16)
            ends = offs[1:].contiguous()
            try:
                r["grouped_mm_bf16"] = time_graph([(lambda g=g, xb=xb, e=ends: torch._grouped_mm(
                    xb, g.transpose(-2, -1), offs=e)) for g in gcs])
            except Exception as e:
                print(f"# grouped_mm {scen} {shape} T={t} failed: {e}", file=sys.stderr)
            del gcs, wb
        torch.cuda.empty_cache()
        base[t] = r
    for f in formats:
        st = Stack(f, w16)
        for t in tokens_list:
            b = base[t]
            x, offs = b["x"], b["offs"]
            nc = copies_for(int(st.expert_bytes * b["active"]), st.full_bytes)
            cps = st.take(nc)
            r = {k: v for k, v in b.items() if k not in ("x", "offs")}
            r["format"] = f
            rpe = dispatch.grouped_rows_per_expert(b["rows"], n_exp)
            gemv = "gemv" if f == "awq" else "gemv_sk"  # kbit: the stream-K GEMV itself
            runs = [("gemv", gemv, None, None)] if rpe <= 8 else []
            runs += [("mma", "mma", None, None), ("op", None, None, None)]
            if f != "awq":  # bf16 x, as vLLM runs MoE models (its own kernels: staged x, dequant + grouped_mm)
                runs.append(("op_bf16", None, None, None))
            if f in SWEEP_BM:  # every MMA row tile, to place the dispatch thresholds
                runs += [(f"mma_bm{bm}", "mma", bm, None) for bm in SWEEP_BM[f]]
                if f != "awq" and rpe <= 8:  # the fixed-order slot GEMV (deterministic mode's)
                    runs.append(("gemv_slot", "gemv_slot", None, None))
            if f in SWEEP_MP and rpe <= 8:  # the stream-K GEMV at every rows-per-pass
                runs += [(f"gemv_mp{mp}", "gemv_sk", None, mp) for mp in SWEEP_MP[f]]
            if cuda_ops.wgmma_ok(x.device, 4 if f == "awq" else int(f[1:])):  # the Hopper grouped kernels
                runs.append(("wgmma", "wgmma", None, None))
            if f != "awq" and use_gmm and rpe > 8:  # bf16 prefill path: dequantize all + torch grouped GEMM
                runs.append(("dequant_bf16", "dequant", None, None))
            xb = x.to(torch.bfloat16)
            for key, path, bm, mp in runs:
                try:
                    xk = xb if key.endswith("_bf16") else x
                    r[key] = time_graph([st.call(c, xk, offs, path, bm, mp) for c in cps])
                except Exception as e:  # report, keep going
                    print(f"# {scen} {shape} {f} T={t} {key} failed: {e}", file=sys.stderr)
            r["floor"] = (st.expert_bytes * b["active"] + 2 * b["rows"] * (in_f + out_f)) / bw * 1e6
            rows_out.append(r)
        del st
        torch.cuda.empty_cache()
    return rows_out


def _get(rows: list[dict], **kw) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in kw.items())), None)


def print_tables(rows: list[dict]) -> None:
    fmts = [f for f in FORMATS if any(r["format"] == f for r in rows)]
    for scen, shape in dict.fromkeys((r["scenario"], r["shape"]) for r in rows):
        sel = [r for r in rows if r["scenario"] == scen and r["shape"] == shape]
        r0 = sel[0]
        print(f"\n### {scen} {shape} {r0['in']}x{r0['out']}, {r0['experts']} experts, top-{r0['topk']} "
              "(µs per call; op = the op's own dispatch)\n")
        print("| tokens | rows | active | max rows | fp16 bmm | bf16 grouped_mm | "
              + " | ".join(f"{f} op" for f in fmts) + " | " + " | ".join(f"{f} vs fp16" for f in fmts)
              + " | k4 floor |")
        print("|---" * (6 + 2 * len(fmts) + 1) + "|")
        for t in sorted({r["tokens"] for r in sel}):
            rs = {f: _get(sel, tokens=t, format=f) for f in fmts}
            b = next(r for r in rs.values() if r is not None)
            ops_ = [fmt(rs[f].get("op")) if rs[f] else "-" for f in fmts]
            ratios = [f"{b['fp16_bmm'] / rs[f]['op']:.2f}x" if rs[f] and rs[f].get("op") else "-" for f in fmts]
            k4 = rs.get("k4")
            print(f"| {t} | {b['rows']} | {b['active']} | {b['max_rows']} | {fmt(b['fp16_bmm'])} | "
                  f"{fmt(b.get('grouped_mm_bf16'))} | " + " | ".join(ops_) + " | " + " | ".join(ratios)
                  + f" | {fmt(k4['floor']) if k4 else '-'} |")
        print(f"\n#### {scen} {shape}: paths (gemv (kbit: stream-K) / mma / op; kbit bf16: dequant + grouped_mm; "
              "Hopper: wgmma)\n")
        print("| tokens | " + " | ".join(fmts) + " |")
        print("|---" * (1 + len(fmts)) + "|")
        for t in sorted({r["tokens"] for r in sel}):
            cells = []
            for f in fmts:
                r = _get(sel, tokens=t, format=f)
                cell = "-" if r is None else f"{fmt(r.get('gemv'))} / {fmt(r.get('mma'))} / {fmt(r.get('op'))}"
                if r is not None and r.get("op_bf16"):
                    cell += f"; bf16 op {fmt(r['op_bf16'])}"
                if r is not None and r.get("dequant_bf16"):
                    cell += f"; {fmt(r['dequant_bf16'])}"
                if r is not None and r.get("wgmma"):
                    cell += f"; wgmma {fmt(r['wgmma'])}"
                cells.append(cell)
            print(f"| {t} | " + " | ".join(cells) + " |")


def print_sweep(rows: list[dict]) -> None:
    """Grouped MMA per row tile (SWEEP_BM formats): where each tile wins, for the dispatch tables."""
    for f, bms in SWEEP_BM.items():
        sel = [r for r in rows if r["format"] == f]
        if not sel:
            continue
        print(f"\n### {f}: grouped GEMV and MMA per row tile (µs; rpe = rows / min(experts, rows))\n")
        mps = SWEEP_MP.get(f, ())
        print("| scenario | shape | tokens | rpe | max rows | gemv sk | " + " | ".join(f"sk mp{m}" for m in mps)
              + (" | " if mps else "") + "gemv slot | " + " | ".join(f"mma bm{b}" for b in bms) + " | op |")
        print("|---" * (8 + len(mps) + len(bms)) + "|")
        for r in sel:
            rpe = -(-r["rows"] // min(r["experts"], r["rows"]))
            print(f"| {r['scenario']} | {r['shape']} | {r['tokens']} | {rpe} | {r['max_rows']} | "
                  f"{fmt(r.get('gemv'))} | "
                  + " | ".join(fmt(r.get(f"gemv_mp{m}")) for m in mps) + (" | " if mps else "")
                  + f"{fmt(r.get('gemv_slot'))} | "
                  + " | ".join(fmt(r.get(f"mma_bm{b}")) for b in bms) + f" | {fmt(r.get('op'))} |")


def print_summary(rows: list[dict]) -> None:
    """Per scenario, gate + down summed: fp16 bmm time / op time, per format and token count."""
    print("\n### Summary: gate + down summed, fp16 bmm / op (targets, k4: >= 2x at 1..8 tokens, >= 1x at 512)\n")
    fmts = [f for f in FORMATS if any(r["format"] == f for r in rows)]
    for scen in dict.fromkeys(r["scenario"] for r in rows):
        for f in fmts:
            parts = []
            for t in sorted({r["tokens"] for r in rows if r["scenario"] == scen}):
                sel = [r for r in rows if r["scenario"] == scen and r["format"] == f and r["tokens"] == t]
                if sel and all(r.get("op") for r in sel):
                    parts.append(f"T={t}: {sum(r['fp16_bmm'] for r in sel) / sum(r['op'] for r in sel):.2f}x")
            print(f"{scen} {f}: " + ", ".join(parts))
            parts = []
            for t in sorted({r["tokens"] for r in rows if r["scenario"] == scen}):
                sel = [r for r in rows if r["scenario"] == scen and r["format"] == f and r["tokens"] == t]
                if sel and all(r.get("op_bf16") for r in sel):
                    parts.append(f"T={t}: {sum(r['fp16_bmm'] for r in sel) / sum(r['op_bf16'] for r in sel):.2f}x")
            if parts:
                print(f"{scen} {f} bf16 x: " + ", ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="bench_moe.json")
    ap.add_argument("--quick", action="store_true", help="k4 and awq only")
    ap.add_argument("--tokens", default=None, help="comma list (default 1,2,4,8,16,64,256,512,1024)")
    ap.add_argument("--formats", default=None, help="comma list of k2,k3,k4,k5,awq")
    args = ap.parse_args()
    bw, dev = start_run()
    gen = torch.Generator().manual_seed(0)
    formats = args.formats.split(",") if args.formats else (["k4", "awq"] if args.quick else FORMATS)
    tokens = [int(v) for v in args.tokens.split(",")] if args.tokens else TOKENS
    rows: list[dict] = []
    t0 = time.time()
    for scen, n_exp, topk, shapes in SCENARIOS:
        for shape, in_f, out_f in shapes:
            new = bench_shape(scen, n_exp, topk, shape, in_f, out_f, formats, tokens, bw, gen)
            rows += new
            print(f"# {scen} {shape} done at {time.time() - t0:.0f}s", flush=True)
            print_tables(new)  # as each shape finishes, so a timeout still leaves results
            with open(args.json, "w") as f:
                json.dump({"device": dev, "hbm_bytes_per_s": bw, "awq_group": AWQ_GROUP, "rows": rows}, f, indent=1)
    print_sweep(rows)
    print_summary(rows)


if __name__ == "__main__":
    main()
