"""`kbit-vllm bench`: run the kernel benchmarks on a GPU; write markdown tables, JSON and PNG plots.

Runs benchmarks/bench_kbit.py and benchmarks/bench_awq.py from the source checkout unchanged
(their timing method is the one RESULTS.md documents), each writing its JSON; their stdout is
the markdown tables. Plots need matplotlib (`pip install kbit_vllm[plot]`); without it the
tables and JSON are still written and `kbit-vllm bench --plot-from DIR` plots them later.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from ._common import repo_root

# Our kernel paths as the benchmarks name them, in plot order.
PATHS = ("gemv", "gemv_sk", "gemv_cluster", "gemv_rows", "mma", "dequant", "op")
LABELS = {"gemv": "GEMV", "gemv_sk": "GEMV (stream-K)", "gemv_cluster": "GEMV (cluster)",
          "gemv_rows": "GEMV (row-slice)", "mma": "MMA",
          "dequant": "dequant + cuBLAS",
          "op": "op (dispatched)", "cublas_fp16": "cuBLAS fp16", "floor": "bandwidth floor"}


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="kernel benchmarks on a GPU: tables, JSON and PNG plots",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench_out", help="output folder (default ./bench_out)")
    p.add_argument("--quick", action="store_true", help="fewer weight copies (and k=4 only for kbit)")
    p.add_argument("--ms", default=None, help="comma-separated M values (default: the benchmarks' own)")
    p.add_argument("--only", choices=("kbit", "awq"), default=None, help="run one of the two benchmarks")
    p.add_argument("--kbit-args", default="", help="extra bench_kbit.py arguments, e.g. '--ks 3,4 --shapes down'")
    p.add_argument("--plot-from", default=None, metavar="DIR",
                   help="only plot the JSON files an earlier run left in DIR (no GPU needed)")
    return p


def plot(json_path: Path, out_dir: Path) -> list[Path]:
    """One PNG per method (and per k for kbit): a panel per shape, time vs M for each kernel path,
    beside cuBLAS fp16 and the bandwidth floor. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(json_path.read_text())
    rows = data["rows"]
    method = "awq_orin" if "group" in data else "kbit"
    written = []
    for k in sorted({r.get("k") for r in rows}, key=lambda v: v or 0):
        sel = [r for r in rows if r.get("k") == k]
        shapes = list(dict.fromkeys((r["shape"], r["in"], r["out"]) for r in sel))
        cols = min(3, len(shapes))
        nrows = (len(shapes) + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.3 * nrows), squeeze=False)
        for ax, (name, in_f, out_f) in zip(axes.flat, shapes, strict=False):
            rs = sorted((r for r in sel if r["shape"] == name), key=lambda r: r["M"])
            for key in PATHS + ("cublas_fp16", "floor"):
                pts = [(r["M"], r[key]) for r in rs if r.get(key) is not None]
                if not pts:
                    continue
                style = {"cublas_fp16": dict(color="black", ls="--"), "floor": dict(color="gray", ls=":")}.get(
                    key, dict(marker="o", ms=3))
                ax.plot(*zip(*pts, strict=True), label=LABELS[key], **style)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{name} {in_f}x{out_f}", fontsize=9)
            ax.set_xlabel("M (rows)")
            ax.set_ylabel("µs per call")
            ax.grid(alpha=0.3, which="both")
        for ax in list(axes.flat)[len(shapes):]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        title = f"{method}" + (f" k={k}" if k is not None else "") + f" on {data.get('device', '?')}"
        fig.suptitle(title)
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
        fig.tight_layout(rect=(0, 0.05, 1, 0.96))
        path = out_dir / (f"{method}_k{k}.png" if k is not None else f"{method}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_dir(out_dir: Path) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"matplotlib is not installed: tables and JSON are in {out_dir}; "
              f"`pip install matplotlib` then `kbit-vllm bench --plot-from {out_dir}`")
        return 0
    files = sorted(out_dir.glob("bench_*.json"))
    if not files:
        print(f"error: no bench_*.json in {out_dir}", file=sys.stderr)
        return 2
    for f in files:
        for png in plot(f, out_dir):
            print(f"wrote {png}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.plot_from:
        return plot_dir(Path(args.plot_from))
    import torch

    if not torch.cuda.is_available():
        print("kbit-vllm bench times the CUDA kernels and needs an NVIDIA GPU (sm_80+); this machine has none.\n"
              "On CPU, `kbit-vllm roundtrip` checks the ops and `kbit-vllm demo` runs a model end to end.",
              file=sys.stderr)
        return 2
    root = repo_root()
    if root is None:
        print("error: the benchmarks live in the source checkout (benchmarks/); install with "
              "`pip install -e .` from a clone of the repository", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [("kbit", "bench_kbit.py", args.kbit_args.split()), ("awq", "bench_awq.py", [])]
    for name, script, extra in jobs:
        if args.only and args.only != name:
            continue
        cmd = [sys.executable, str(root / "benchmarks" / script), "--json", str(out / f"bench_{name}.json")]
        cmd += (["--quick"] if args.quick else []) + (["--ms", args.ms] if args.ms else []) + extra
        print(f"running {' '.join(cmd)}", flush=True)
        with open(out / f"bench_{name}.md", "w") as md:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=root)
            for line in proc.stdout:  # tee: progress on the terminal, tables into the file
                sys.stdout.write(line)
                md.write(line)
            if proc.wait() != 0:
                print(f"error: {script} failed with code {proc.returncode}", file=sys.stderr)
                return 1
        print(f"wrote {out / f'bench_{name}.md'} and {out / f'bench_{name}.json'}")
    return plot_dir(out)
