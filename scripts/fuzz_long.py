"""Long randomized sweep of every op on the GPU (issue #9): kbit_vllm/fuzz.py with layer-sized shapes.

On the device, from the repo root (the library built or carried in kbit_vllm/lib):
    PYTHONPATH=. python scripts/fuzz_long.py --seconds 200 --out "$OUT"
Runs random cases (ops and every named kernel path, both deterministic modes, NaN/Inf
activations) until the time is up, then writes fuzz_long.json (every record and failure) and
fuzz_long.md (per op/path: cases, k / group sizes, dtypes, M / shape / tokens-per-expert ranges).
Exit status 1 if any case failed. --device cpu runs the same sweep on the CPU ops.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from kbit_vllm import fuzz
from kbit_vllm.backends.cuda import library


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(meta: dict, summary: dict, failures: list[str]) -> str:
    lines = [f"# fuzz_long {meta['date']}", "",
             f"device: {meta['device']}; library: {meta['library']}; commit {meta['commit']}; seed {meta['seed']}; "
             f"{meta['cases']} cases, {meta['checks']} checks in {meta['seconds']} s; failures: {len(failures)}", "",
             "| op/path | checks | k or group | dtypes | M | in | out | tokens/expert max | det | NaN/Inf x |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def rng(d: dict, key: str) -> str:
        r = d.get(key + "_range")
        return f"{r['min']}..{r['max']}" if r else "-"

    def keys(d: dict, key: str) -> str:
        return ",".join(sorted(d.get(key, {}))) or "-"

    for name, d in summary.items():
        kg = keys(d, "k") if "k" in d else keys(d, "group")
        lines.append(f"| {name} | {d['n']['cases']} | {kg} | {keys(d, 'dtype')} | {rng(d, 'm')} | {rng(d, 'in')} | "
                     f"{rng(d, 'out')} | {rng(d, 'max_tokens_per_expert')} | {keys(d, 'deterministic')} | "
                     f"{keys(d, 'nonfinite')} |")
    if failures:
        lines += ["", "## Failures (first 50)", ""] + [f"- {f}" for f in failures[:50]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=200)
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="fuzz_out")
    ap.add_argument("--small", action="store_true", help="the short mode's shapes instead of layer-sized ones")
    a = ap.parse_args()
    if a.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("no CUDA GPU", file=sys.stderr)
            return 2
        ok, why = library.device_supported(torch.cuda.current_device())
        if not ok:
            print(f"CUDA kernels unavailable: {why}", file=sys.stderr)
            return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    sizes = fuzz.SHORT if a.small else fuzz.LONG
    # Small cases first (fast, many boundaries), then layer-sized ones for the rest of the time.
    first = fuzz.run(a.device, a.seed, seconds=a.seconds / 3, sizes=fuzz.SHORT)
    second = fuzz.run(a.device, a.seed + 1, seconds=max(0.0, a.seconds - (time.time() - t0)), sizes=sizes)
    records, failures = first.records + second.records, first.failures + second.failures
    merged = fuzz.Sweep(records, failures)
    dev_name = torch.cuda.get_device_name() if a.device.startswith("cuda") else platform.processor() or "cpu"
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": dev_name, "library": str(library.STATUS),
            "commit": _commit(), "seed": a.seed, "seconds": round(time.time() - t0, 1),
            "cases": sum(1 for r in records if r.get("path") in (None, "op")), "checks": len(records),
            "torch": torch.__version__, "sizes_long": sizes}
    summary = merged.summary()
    (out / "fuzz_long.json").write_text(json.dumps({"meta": meta, "summary": summary, "failures": failures,
                                                    "records": records}, indent=1, default=str))
    md = markdown(meta, summary, failures)
    (out / "fuzz_long.md").write_text(md)
    print(md)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
