"""Compile csrc/*.cu + api.cpp into kbit_vllm/lib/libkbit_vllm.so with nvcc (no libtorch).

Used by setup.py at install time and runnable alone: `python kbit_vllm/csrc/build.py [ARCHS]`.
Archs come from KBIT_CUDA_ARCHS (comma or semicolon list such as "80,86,87,89,90a").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_ARCHS = "80,86,87,89,90a"
CSRC = Path(__file__).resolve().parent
LIB_DIR = CSRC.parent / "lib"


def find_nvcc() -> str | None:
    cands = [os.environ.get("NVCC"), shutil.which("nvcc")]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    cands.append(str(Path(home) / "bin" / "nvcc"))
    return next((c for c in cands if c and Path(c).is_file()), None)


def parse_archs(spec: str) -> list[str]:
    archs = [a.strip().lower().removeprefix("sm_") for a in re.split(r"[,;\s]+", spec) if a.strip()]
    for a in archs:
        if not re.fullmatch(r"\d{2,3}a?", a):
            raise ValueError(f"KBIT_CUDA_ARCHS: bad arch {a!r}; expected e.g. 80,86,87,89,90a")
    return archs


def build(out_dir: Path = LIB_DIR, archs_spec: str | None = None, verbose: bool = True) -> Path:
    nvcc = find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (set NVCC or CUDA_HOME)")
    archs = parse_archs(archs_spec or os.environ.get("KBIT_CUDA_ARCHS", DEFAULT_ARCHS))
    sources = sorted(CSRC.glob("*.cu")) + sorted(CSRC.glob("api*.cpp"))
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "libkbit_vllm.so"
    tmp = out.with_suffix(".so.tmp")
    jobs = os.environ.get("KBIT_NVCC_THREADS", str(os.cpu_count() or 1))
    cmd = [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart", "static",
           "--threads", jobs, "-lineinfo", f"-DKBIT_ARCHS=\"{','.join('sm_' + a for a in archs)}\"",
           *gencode, "-o", str(tmp), *map(str, sources)]
    if verbose:
        print("kbit_vllm: building CUDA library:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=CSRC)
    tmp.replace(out)
    return out


if __name__ == "__main__":
    print(build(archs_spec=sys.argv[1] if len(sys.argv) > 1 else None))
