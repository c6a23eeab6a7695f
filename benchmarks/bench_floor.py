"""What reading the weights costs, measured: the read-only stream kernel (csrc/stream_read.cu) beside
cuBLAS and our ops, under each issue's own timing, so every speed target can be set against what a
plain read of the same bytes takes on this machine.

The targets are ratios to cuBLAS fp16 or to a computed floor (bytes / copy bandwidth). A kernel that
must read a layer's weights cannot beat the fastest plain read of those bytes launched the same way
(launch, DRAM latency and the tail of the wave included; no decode, no x, no reduction), so where a
target asks for less time than that read, no kernel meets it. The read is the best of every unroll
(2, 4, 8 loads a thread) and grid (1, 2, 4 CTAs an SM and the resident maximum) over the same rotated
copies; "launch" is the same kernel reading nothing.

Dense layers at M=1 (issues 3 and 4) in both of the project's timings: back to back (DESIGN.md's
graph replay, where our PDL kernels overlap the call before; the read may stream its weights before
that call ends, as a GEMV may) and behind a kernel without PDL that writes x, its time taken off
(bench_kbit.py --behind-writer, as vLLM runs them): seed 002's five layers and Llama-3-8B's four;
cuBLAS fp16 and bf16, the kbit op (k = 4, 2; fp16 and bf16 x), the awq_orin op (fp16 x, group 128),
torch's int4 tinygemm (bf16 x) on the Llama layers, and the read of each one's resident bytes. The
verdicts compare fp16 x with cuBLAS fp16. MoE (issue 6), back to back as bench_moe.py times it, fp16
x: seed 002's 8 experts and Qwen3-like 128 experts top-8 at 1..8 tokens; cuBLAS fp16 bmm over the
active experts, the kbit op (k = 4), and the read of the active experts' k=4 bytes, which waits for
the kernel before it (the experts come from the routing).

Usage (GPU machine, repo root): python benchmarks/bench_floor.py [--json PATH] [--quick]
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
from bench_kbit import LLAMA, SEED_DENSE, make_tinygemm, n_copies, start_run, time_graph, timed  # noqa: E402
from bench_moe import SCENARIOS, Stack, copies_for, expert_offsets, fp16_bmm_time, route  # noqa: E402

from kbit_vllm import ops  # noqa: E402
from kbit_vllm.backends.cuda import stream_read as sr  # noqa: E402
from kbit_vllm.backends.cuda.library import sm_count  # noqa: E402
from kbit_vllm.formats import normal_float_codebook, quantize_awq_rtn  # noqa: E402

AWQ_GROUP = 128
MOE_TOKENS = [1, 2, 4, 8]
# Targets, as the issues state them.
SEED_SUM_TARGETS = {4: 2.5, 2: 3.0}  # issue 3: M=1, seed 002's five layers summed, x faster than cuBLAS fp16
KBIT_FLOOR_TARGET = 1.25             # issue 3: M=1 k=4 on the two large Llama layers, within 1.25x the floor
AWQ_FLOOR_TARGET, AWQ_TINY_TARGET = 1.3, 1.8  # issue 4: M=1 within 1.3x the floor, 1.8x faster than tinygemm
MOE_TARGET = 2.0                     # issue 6: 1..8 tokens, 2x faster than fp16 bmm (gate + down)


class Reader:
    """Times the read kernel over rotated buffers of n bytes, best of every unroll and grid."""

    def __init__(self, device: torch.device, quick: bool) -> None:
        self.device = device
        self.unrolls = (4, 8) if quick else sr.UNROLLS
        self.sink = torch.zeros(64 * 1024, dtype=torch.int32, device=device)
        self.sms = sm_count(device)

    def grids(self, unroll: int) -> list[int]:
        top = sr.ctas_per_sm(unroll)
        return sorted({min(p, top) * self.sms for p in (1, 2, 4, top)})

    def time(self, nbytes: int, x: torch.Tensor | None = None, wait_first: bool = False) -> tuple[float, str]:
        """(µs, variant) of the fastest read of nbytes (rounded up to 16) from rotated copies: behind the
        writer of x when x is given, else back to back."""
        nbytes = -(-nbytes // 16) * 16
        bufs = [torch.empty(max(nbytes, 16), dtype=torch.uint8, device=self.device)[:nbytes]
                for _ in range(n_copies(nbytes) if nbytes else 64)]
        best = (float("inf"), "")
        for u in self.unrolls:
            for ctas in self.grids(u):
                calls = [(lambda b=b, c=ctas, u=u: sr.stream_read(b, self.sink, c, u, wait_first)) for b in bufs]
                us = timed(calls, x) if x is not None else time_graph(calls)
                best = min(best, (us, f"u{u} {ctas // self.sms}/SM"))
        del bufs
        return best


def bench_dense(name: str, in_f: int, out_f: int, rd: Reader, bw: float, writer: bool) -> dict:
    """One layer at M=1: every call behind the writer of its x (writer) or back to back."""
    r: dict = {"mode": "writer" if writer else "b2b", "shape": name, "in": in_f, "out": out_f}
    xh = torch.randn(1, in_f, device="cuda", dtype=torch.float16)
    xb = xh.to(torch.bfloat16)

    def t(calls, x: torch.Tensor) -> float:
        return timed(calls, x) if writer else time_graph(calls)

    w = torch.randn(out_f, in_f, device="cuda", dtype=torch.float16) * 0.05
    for key, dt, x in (("cublas_fp16", torch.float16, xh), ("cublas_bf16", torch.bfloat16, xb)):
        wc = [w.to(dt) for _ in range(n_copies(w.numel() * 2))]
        r[key] = t([(lambda c=c, x=x: F.linear(x, c)) for c in wc], x)
        del wc
    r["read_fp16"] = rd.time(w.numel() * 2, xh if writer else None)[0]
    for k in (4, 2):
        cb = normal_float_codebook(k).cuda()
        pt, at = ops.kbit_repack(*ops.kbit_quantize(w, cb, k), k)
        nbytes = pt.numel() * 4 + at.numel()
        cps = [(pt.clone(), at.clone()) for _ in range(n_copies(nbytes))]
        for dn, x in (("fp16", xh), ("bf16", xb)):
            r[f"k{k}_op_{dn}"] = t([(lambda c=c, x=x, cb=cb, k=k: ops.kbit_linear(x, c[0], c[1], cb, None, k, out_f))
                                    for c in cps], x)
        r[f"k{k}_read"], r[f"k{k}_read_variant"] = rd.time(nbytes, xh if writer else None)
        r[f"k{k}_floor"] = (nbytes + 2 * (in_f + out_f)) / bw * 1e6
        del cps
    wq, sz = ops.awq_repack(*quantize_awq_rtn(w, AWQ_GROUP, scale_dtype=torch.float16), AWQ_GROUP, torch.float16)
    resident = wq.numel() * 4 + sz.numel() * 2
    ckpt = in_f * out_f // 2 + (in_f // AWQ_GROUP) * out_f * (2 + 0.5)  # int4 weights, fp16 scales, int4 zeros
    cps = [(wq.clone(), sz.clone()) for _ in range(n_copies(resident))]
    r["awq_op"] = t([(lambda c=c: ops.awq_linear(xh, c[0], c[1], None, AWQ_GROUP, out_f)) for c in cps], xh)
    r["awq_read"], r["awq_read_variant"] = rd.time(resident, xh if writer else None)
    r["awq_floor"] = (ckpt + 2 * (in_f + out_f)) / bw * 1e6
    del cps
    if (name, in_f, out_f) in LLAMA:
        tiny = make_tinygemm(w, n_copies(w.numel() * 2))
        if tiny is not None:
            r["tinygemm"] = t([(lambda q=q: torch._weight_int4pack_mm(xb, q[0], 128, q[1])) for q in tiny], xb)
    torch.cuda.empty_cache()
    return r


def bench_moe(scen: str, n_exp: int, topk: int, shape: str, in_f: int, out_f: int, tokens: list[int], rd: Reader,
              gen: torch.Generator) -> list[dict]:
    """Grouped layers back to back (bench_moe.py's timing), fp16 x."""
    w16 = torch.randn(n_exp, out_f, in_f, device="cuda", dtype=torch.float16) * 0.05
    st = Stack("k4", w16)
    rows = []
    for t in tokens:
        counts = route(n_exp, topk, t, gen)
        n_rows, a = int(counts.sum()), int((counts > 0).sum())
        offs = expert_offsets(counts)
        r = {"scenario": scen, "shape": shape, "tokens": t, "rows": n_rows, "active": a,
             "fp16_bmm": fp16_bmm_time(w16, counts)}
        x = torch.randn(n_rows, in_f, device="cuda", dtype=torch.float16)
        cps = st.take(copies_for(int(st.expert_bytes * a), st.full_bytes))
        r["k4_op"] = time_graph([st.call(c, x, offs, None) for c in cps])
        r["k4_read"], r["k4_read_variant"] = rd.time(int(st.expert_bytes * a), wait_first=True)
        rows.append(r)
    del st, w16
    torch.cuda.empty_cache()
    return rows


MODES = {"b2b": "back to back (DESIGN.md's graph replay)", "writer": "behind a writer of x (as in vLLM)"}


def _f(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _verdict(best: float, want: float, more_is_better: bool) -> str:
    return "yes" if (best >= want if more_is_better else best <= want) else "no"


def summarize_dense(dense: list[dict], mode: str) -> list[str]:
    """One mode's layer table and its issue 3 / 4 targets against the read."""
    rows = [r for r in dense if r["mode"] == mode]
    out = [f"### Dense layers, M=1, {MODES[mode]} (µs; op columns fp16 x / bf16 x)", "",
           "| layer | cuBLAS fp16 | cuBLAS bf16 | read fp16 | k=4 op | k=4 read | k=4 floor | k=2 op | k=2 read | "
           "awq op | awq read | awq floor | tinygemm |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {r['in']}x{r['out']} | {_f(r['cublas_fp16'])} | {_f(r['cublas_bf16'])} | {_f(r['read_fp16'])} | "
            f"{_f(r['k4_op_fp16'])} / {_f(r['k4_op_bf16'])} | {_f(r['k4_read'])} | {_f(r['k4_floor'])} | "
            f"{_f(r['k2_op_fp16'])} / {_f(r['k2_op_bf16'])} | {_f(r['k2_read'])} | {_f(r['awq_op'])} | "
            f"{_f(r['awq_read'])} | {_f(r['awq_floor'])} | {_f(r.get('tinygemm'))} |" for r in rows]
    out += ["", "| target | asks | now (op, fp16 x) | best possible (read) | reachable |", "|---|---|---|---|---|"]
    seed = [r for r in rows if r["shape"] in {n for n, _, _ in SEED_DENSE}]
    if len(seed) == len(SEED_DENSE):
        fp16 = sum(r["cublas_fp16"] for r in seed)
        for k, want in SEED_SUM_TARGETS.items():
            now, best = fp16 / sum(r[f"k{k}_op_fp16"] for r in seed), fp16 / sum(r[f"k{k}_read"] for r in seed)
            out.append(f"| issue 3: seed 002 M=1 summed, k={k}, x cuBLAS fp16 | {want:.2f}x | {now:.2f}x | "
                       f"{best:.2f}x | {_verdict(best, want, True)} |")
    for r in rows:
        if r["shape"] not in ("l3_gateup", "l3_down"):
            continue
        lay = f"{r['in']}x{r['out']}"
        checks = [(f"issue 3: {lay} M=1 k=4 within {KBIT_FLOOR_TARGET}x the floor", KBIT_FLOOR_TARGET * r["k4_floor"],
                   r["k4_op_fp16"], r["k4_read"]),
                  (f"issue 4: {lay} M=1 awq within {AWQ_FLOOR_TARGET}x the floor", AWQ_FLOOR_TARGET * r["awq_floor"],
                   r["awq_op"], r["awq_read"])]
        if r.get("tinygemm") is not None:
            checks.append((f"issue 4: {lay} M=1 awq {AWQ_TINY_TARGET}x faster than tinygemm",
                           r["tinygemm"] / AWQ_TINY_TARGET, r["awq_op"], r["awq_read"]))
        out += [f"| {what} | <= {cap:.2f} µs | {now:.2f} µs | {best:.2f} µs | {_verdict(best, cap, False)} |"
                for what, cap, now, best in checks]
    return out + [""]


def summarize(dense: list[dict], moe: list[dict], launch: dict) -> str:
    """The tables and each target against the read: the best ratio any kernel could reach."""
    out = [f"Launch (the read kernel reading nothing): back to back {launch['b2b']:.2f} µs, behind a writer "
           f"{launch['writer']:.2f} µs.", ""]
    for mode in MODES:
        if any(r["mode"] == mode for r in dense):
            out += summarize_dense(dense, mode)
    if moe:
        out += ["### MoE, back to back, fp16 x (µs; the read waits for the kernel before it)", "",
                "| target | asks | now (op) | best possible (read) | reachable |", "|---|---|---|---|---|"]
        for scen in dict.fromkeys(r["scenario"] for r in moe):
            for t in dict.fromkeys(r["tokens"] for r in moe):
                sel = [r for r in moe if r["scenario"] == scen and r["tokens"] == t]
                fp16 = sum(r["fp16_bmm"] for r in sel)
                now, best = fp16 / sum(r["k4_op"] for r in sel), fp16 / sum(r["k4_read"] for r in sel)
                out.append(f"| issue 6: {scen} T={t} gate + down k=4, x fp16 bmm | {MOE_TARGET:.1f}x | {now:.2f}x | "
                           f"{best:.2f}x | {_verdict(best, MOE_TARGET, True)} |")
        out += ["", "| scenario | layer | T | rows | active | fp16 bmm | k=4 op | k=4 read |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['scenario']} | {r['shape']} | {r['tokens']} | {r['rows']} | {r['active']} | "
                f"{r['fp16_bmm']:.2f} | {r['k4_op']:.2f} | {r['k4_read']:.2f} |" for r in moe]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="bench_floor.json")
    ap.add_argument("--quick", action="store_true", help="unroll 4 and 8 only")
    ap.add_argument("--no-moe", action="store_true")
    args = ap.parse_args()
    bw, dev = start_run()
    bench_kbit.BEHIND_WRITER = True  # timed(): behind a writer of x, its time taken off
    device = torch.device("cuda")
    rd = Reader(device, args.quick)
    x0 = torch.randn(1, 4096, device=device, dtype=torch.bfloat16)
    launch = {"b2b": rd.time(0)[0], "writer": rd.time(0, x0)[0]}
    t0 = time.time()
    dense = []
    for writer in (False, True):
        for name, in_f, out_f in SEED_DENSE + LLAMA:
            dense.append(bench_dense(name, in_f, out_f, rd, bw, writer))
            print(f"# {name} {'behind a writer' if writer else 'back to back'} done at {time.time() - t0:.0f}s",
                  flush=True)
    moe = []
    if not args.no_moe:
        gen = torch.Generator().manual_seed(0)
        for scen, n_exp, topk, shapes in SCENARIOS:
            for shape, in_f, out_f in shapes:
                moe += bench_moe(scen, n_exp, topk, shape, in_f, out_f, MOE_TOKENS, rd, gen)
                print(f"# {scen} {shape} done at {time.time() - t0:.0f}s", flush=True)
    print(summarize(dense, moe, launch))
    with open(args.json, "w") as fh:
        json.dump({"device": dev, "hbm_bytes_per_s": bw, "launch": launch, "dense": dense, "moe": moe}, fh, indent=1)


if __name__ == "__main__":
    main()
