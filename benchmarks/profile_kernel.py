"""Call one kbit_linear kernel path a few times, for Nsight Compute (ncu) to profile.

Usage (GPU machine, repo root):
    ncu --section SpeedOfLight --section WarpStateStats -k regex:gemv \\
        python3 benchmarks/profile_kernel.py --in 4096 --out 28672 --k 4 --m 1 --path gemv
"""

from __future__ import annotations

import argparse

import torch

from kbit_vllm import ops
from kbit_vllm.backends.cuda import ops as cuda_ops
from kbit_vllm.formats import normal_float_codebook


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="in_f", type=int, default=4096)
    ap.add_argument("--out", dest="out_f", type=int, default=28672)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--path", default="gemv")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--dtype", default="float16")
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    cb = normal_float_codebook(a.k).cuda()
    w = torch.randn(a.out_f, a.in_f, device="cuda", dtype=dt) * 0.05
    pt, at = ops.kbit_repack(*ops.kbit_quantize(w, cb, a.k), a.k)
    x = torch.randn(a.m, a.in_f, device="cuda", dtype=dt)
    for _ in range(a.calls):
        cuda_ops.linear_path(x, pt, at, cb, None, a.k, a.out_f, a.path)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
