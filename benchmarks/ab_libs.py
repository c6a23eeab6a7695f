"""A/B of CUDA library builds: the same forced kernel paths (or the op) timed under each library,
each library in its own process, the processes interleaved over rounds in one call, so that the
GPU's drift between calls does not pass for a kernel change.

Why: a kernel experiment is a second build of libkbit_vllm.so (a template switch, a macro); one
process can load only one (KBIT_VLLM_LIBRARY). Timing as bench_kbit.py times (CUDA-graph replay
over rotated weight copies, median), behind a writer of x by default (as vLLM runs a linear). Each
cell is checked against the same library's dequantize + cuBLAS path (--moe: its grouped MMA), as a
relative error.

Usage (GPU machine, repo root; libraries built for this GPU):
    python3 benchmarks/ab_libs.py --libs base=/tmp/a.so,new=/tmp/b.so --shapes 4096x28672,14336x4096 \\
        --ks 4,2 --ms 16,32 --paths wgmma [--awq] [--rounds 2] [--budget 200] [--json ab.json]
    python3 benchmarks/ab_libs.py --libs ... --moe qwen128 --tokens 64,256 --paths wgmma,op
(--moe: the grouped kernels on bench_moe.py's scenarios instead of dense layers; M is then the
token count, each token routed to top-k random experts as bench_moe.py routes them.)
Prints one line per timing as it lands, then a table: a row per (layer, k, M, path), each library's
times over the rounds, and the ratio of each library's median to the first one's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PREFIX = "AB "  # child result lines: PREFIX + JSON


def parse_libs(spec: str) -> list[tuple[str, str]]:
    """'name=path,name=path' -> [(name, path)], names unique (the first is the baseline)."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--libs: expected name=path, got {item!r}")
        out.append((name, path))
    names = [n for n, _ in out]
    if len(set(names)) != len(names) or len(out) < 1:
        raise ValueError(f"--libs: need one or more uniquely named libraries, got {names}")
    return out


def parse_shapes(spec: str) -> list[tuple[int, int]]:
    """'INxOUT,INxOUT' -> [(in, out)], in a multiple of 32."""
    shapes = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        a, sep, b = item.partition("x")
        if not sep or not a.isdigit() or not b.isdigit() or int(a) % 32:
            raise ValueError(f"--shapes: expected INxOUT with IN a multiple of 32, got {item!r}")
        shapes.append((int(a), int(b)))
    return shapes


def summarize(records: list[dict], libs: list[str]) -> str:
    """Markdown table of child records ({lib, shape, k, m, path, us, err}): a row per (shape, k, m,
    path) in first-seen order, each library's times over the rounds, and median / first library's
    median."""
    keys: list[tuple] = []
    cells: dict[tuple, dict[str, list[float]]] = {}
    errs: dict[tuple, float] = {}
    for r in records:
        key = (r["shape"], r["k"], r["m"], r["path"])
        if key not in cells:
            keys.append(key)
            cells[key] = {}
        cells[key].setdefault(r["lib"], []).append(r["us"])
        err = r["err"] if r["err"] == r["err"] else math.inf  # a NaN output must not vanish in max()
        errs[key] = max(errs.get(key, 0.0), err)
    head = "| layer | k | M | path | " + " | ".join(f"{n} µs" for n in libs)
    head += "".join(f" | {n} / {libs[0]}" for n in libs[1:]) + " | max rel. err |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for key in keys:
        c = cells[key]
        times = [" / ".join(f"{t:.2f}" for t in c.get(n, [])) or "-" for n in libs]
        base = statistics.median(c[libs[0]]) if c.get(libs[0]) else None
        ratios = [f"{statistics.median(c[n]) / base:.3f}" if base and c.get(n) else "-" for n in libs[1:]]
        shape, k, m, path = key
        lines.append(f"| {shape} | {k} | {m} | {path} | " + " | ".join(times)
                     + "".join(f" | {r}" for r in ratios) + f" | {errs[key]:.1e} |")
    return "\n".join(lines)


def measure(calls: list, x, ref, label: str) -> tuple[float, float] | None:
    """(µs per call over calls, relative error of calls[0]'s output against ref), timed as
    bench_kbit.timed times; None, reported on stderr, where the path does not take this layer or M."""
    import bench_kbit

    try:
        y = calls[0]().float()
        return bench_kbit.timed(calls, x), ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    except Exception as e:  # report, keep going
        print(f"# {label}: {e}", file=sys.stderr, flush=True)
        return None


def run_child(args: argparse.Namespace) -> None:
    """Time every (shape, k, M, path) under the library this process loaded; print PREFIX lines."""
    import functools

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_kbit

    from kbit_vllm import ops
    from kbit_vllm.backends.cuda import awq_ops, library
    from kbit_vllm.backends.cuda import ops as cuda_ops
    from kbit_vllm.formats import normal_float_codebook, quantize_awq_rtn

    if not library.STATUS.loaded:  # the op would run the PyTorch path and time that instead
        raise SystemExit(f"ab_libs: library {args.child}: {library.STATUS}")
    bench_kbit.BEHIND_WRITER = not args.no_writer
    torch.manual_seed(0)
    if args.moe:
        run_child_moe(args)
        return

    def call(x, c, path: str, cb, k: int, out_f: int):
        """One layer through `path` ("op": the op's own choice); c = the layer's two weight tensors."""
        if cb is None:
            if path == "op":
                return ops.awq_linear(x, c[0], c[1], None, 128, out_f)
            return awq_ops.linear_path(x, c[0], c[1], None, 128, out_f, path)
        if path == "op":
            return ops.kbit_linear(x, c[0], c[1], cb, None, k, out_f)
        return cuda_ops.linear_path(x, c[0], c[1], cb, None, k, out_f, path)

    dt = getattr(torch, args.dtype)
    ks = [4] if args.awq else [int(v) for v in args.ks.split(",")]
    for in_f, out_f in parse_shapes(args.shapes):
        w = torch.randn(out_f, in_f, device="cuda", dtype=dt) * 0.05
        for k in ks:
            if args.awq:
                cb = None
                base = ops.awq_repack(*quantize_awq_rtn(w, 128, scale_dtype=dt), 128, dt)
            else:
                cb = normal_float_codebook(k).cuda()
                base = ops.kbit_repack(*ops.kbit_quantize(w, cb, k), k)
            copies = [tuple(t.clone() for t in base) for _ in range(
                bench_kbit.n_copies(sum(t.numel() * t.element_size() for t in base), 64))]
            for m in (int(v) for v in args.ms.split(",")):
                x = torch.randn(m, in_f, device="cuda", dtype=dt)
                ref = call(x, base, "dequant", cb, k, out_f).float()
                for path in args.paths.split(","):
                    got = measure([functools.partial(call, x, c, path, cb, k, out_f) for c in copies], x, ref,
                                  f"{in_f}x{out_f} k={k} M={m} {path}")
                    if got is None:
                        continue
                    us, err = got
                    rec = {"lib": args.child, "shape": f"{in_f}x{out_f}", "k": "awq" if args.awq else k,
                           "m": m, "path": path, "us": us, "err": err}
                    print(PREFIX + json.dumps(rec), flush=True)
            del copies
            torch.cuda.empty_cache()


def run_child_moe(args: argparse.Namespace) -> None:
    """The grouped kernels (or the grouped op) on bench_moe.py's scenarios, as run_child does dense
    layers; the grouped MMA of the same library is the error reference."""
    import bench_moe
    import torch

    dt = torch.float16 if args.awq else getattr(torch, args.dtype)  # bench_moe's awq stacks are fp16 layouts
    gen = torch.Generator().manual_seed(0)
    fmts = ["awq"] if args.awq else [f"k{v}" for v in args.ks.split(",")]
    scens = {s[0]: s for s in bench_moe.SCENARIOS}
    for name in args.moe.split(","):
        if name not in scens:
            raise SystemExit(f"ab_libs: --moe {name!r}: expected one of {sorted(scens)}")
        _, n_exp, topk, shapes = scens[name]
        for shape, in_f, out_f in shapes:
            w16 = torch.randn(n_exp, out_f, in_f, device="cuda", dtype=torch.float16) * 0.05
            for f in fmts:
                st = bench_moe.Stack(f, w16)
                for t in (int(v) for v in args.tokens.split(",")):
                    counts = bench_moe.route(n_exp, topk, t, gen)
                    offs = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32).cuda()
                    x = torch.randn(int(counts.sum()), in_f, device="cuda", dtype=dt)
                    cps = st.take(bench_moe.copies_for(int(st.expert_bytes * int((counts > 0).sum())), st.full_bytes))
                    ref = st.call(cps[0], x, offs, "mma")().float()
                    for path in args.paths.split(","):
                        p = None if path == "op" else path
                        got = measure([st.call(c, x, offs, p) for c in cps], x, ref, f"{name} {shape} {f} T={t} {path}")
                        if got is None:
                            continue
                        us, err = got
                        rec = {"lib": args.child, "shape": f"{name} {shape} {in_f}x{out_f}", "k": f, "m": t,
                               "path": path, "us": us, "err": err}
                        print(PREFIX + json.dumps(rec), flush=True)
                del st
                torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--libs", required=False, help="name=path,name=path (the first is the baseline)")
    ap.add_argument("--shapes", default="4096x28672,14336x4096,4096x6144", help="INxOUT,...")
    ap.add_argument("--ks", default="4", help="kbit bit widths (ignored with --awq)")
    ap.add_argument("--ms", default="16", help="activation rows")
    ap.add_argument("--paths", default="wgmma",
                    help="kernel paths (linear_path / grouped_path names), or 'op' for the op's choice")
    ap.add_argument("--awq", action="store_true", help="awq_orin (group 128) instead of kbit")
    ap.add_argument("--moe", default=None, help="bench_moe.py scenarios (seed8, qwen128): the grouped kernels")
    ap.add_argument("--tokens", default="64,256", help="--moe: token counts")
    ap.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16"))
    ap.add_argument("--no-writer", action="store_true", help="time back to back, not behind a writer of x")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=150, help="seconds per child process")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run: a child that would start past it is skipped and the one "
                         "running is cut at it, so the table still prints inside an outer time limit")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        run_child(args)
        return
    if not args.libs:
        ap.error("--libs is required")
    libs = parse_libs(args.libs)
    parse_shapes(args.shapes)  # fail here, not in every child
    if args.moe:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_moe import SCENARIOS

        unknown = set(args.moe.split(",")) - {s[0] for s in SCENARIOS}
        if unknown:
            ap.error(f"--moe: unknown scenarios {sorted(unknown)}; expected some of {[s[0] for s in SCENARIOS]}")
    for name, path in libs:
        if not Path(path).is_file():
            ap.error(f"--libs: {name}={path} is not a file")
    child_args = list(sys.argv[1:])
    records: list[dict] = []
    start = time.monotonic()
    for rnd in range(args.rounds):
        for name, path in libs:
            timeout = float(args.timeout)
            if args.budget is not None:
                left = args.budget - (time.monotonic() - start)
                if left < 1.0:
                    print(f"# round {rnd + 1}: {name} skipped (--budget {args.budget:g} s spent)", flush=True)
                    continue
                timeout = min(timeout, left)
            env = dict(os.environ, KBIT_VLLM_LIBRARY=str(Path(path).resolve()), PYTHONUNBUFFERED="1")
            cmd = [sys.executable, __file__, *child_args, "--child", name]
            print(f"# round {rnd + 1}: {name} ({path})", flush=True)
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                print(f"# {name}: timed out after {timeout:.0f} s", flush=True)
                out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode()
            else:
                out = proc.stdout
                if proc.returncode:
                    print(f"# {name}: exit {proc.returncode}\n{proc.stderr[-2000:]}", flush=True)
                else:  # the paths a layer did not take
                    for line in proc.stderr.splitlines():
                        if line.startswith("# "):
                            print(f"# {name}: {line[2:]}", flush=True)
            for line in out.splitlines():
                if line.startswith(PREFIX):
                    rec = json.loads(line[len(PREFIX):])
                    records.append(rec)
                    print(f"{name} {rec['shape']} k={rec['k']} M={rec['m']} {rec['path']}: {rec['us']:.2f} µs "
                          f"err {rec['err']:.1e}", flush=True)
    print()
    print(summarize(records, [n for n, _ in libs]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"libs": dict(libs), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
