"""Call one kbit_linear (or, with --awq, awq_linear group 128) kernel path a few times, for Nsight
Compute (ncu) to profile.

Usage (GPU machine, repo root):
    ncu --section SpeedOfLight --section WarpStateStats -k regex:gemv \\
        python3 benchmarks/profile_kernel.py --in 4096 --out 28672 --k 4 --m 1 --path gemv
    ... python3 benchmarks/profile_kernel.py --awq --in 4096 --out 28672 --m 1 --path gemv_sk
"""

from __future__ import annotations

import argparse

import torch

from kbit_vllm import ops
from kbit_vllm.backends.cuda import awq_ops
from kbit_vllm.backends.cuda import ops as cuda_ops
from kbit_vllm.formats import normal_float_codebook, quantize_awq_rtn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="in_f", type=int, default=4096)
    ap.add_argument("--out", dest="out_f", type=int, default=28672)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--path", default="gemv")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--awq", action="store_true", help="awq_orin (group 128) instead of kbit; --k is ignored")
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    w = torch.randn(a.out_f, a.in_f, device="cuda", dtype=dt) * 0.05
    x = torch.randn(a.m, a.in_f, device="cuda", dtype=dt)
    if a.awq:
        wq, sz = ops.awq_repack(*quantize_awq_rtn(w, 128, scale_dtype=dt), 128, dt)
        for _ in range(a.calls):
            awq_ops.linear_path(x, wq, sz, None, 128, a.out_f, a.path)
    else:
        cb = normal_float_codebook(a.k).cuda()
        pt, at = ops.kbit_repack(*ops.kbit_quantize(w, cb, a.k), a.k)
        for _ in range(a.calls):
            cuda_ops.linear_path(x, pt, at, cb, None, a.k, a.out_f, a.path)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
