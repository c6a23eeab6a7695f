"""The kbit-vllm command line."""

from __future__ import annotations

import argparse
import platform
import sys


def _info(_: argparse.Namespace) -> int:
    import torch

    import kbit_vllm

    print(f"kbit_vllm {kbit_vllm.__version__}  python {platform.python_version()}  torch {torch.__version__}")
    print(kbit_vllm.cuda_library_status())
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))})")
    else:
        print("GPU: none; every op runs the PyTorch path")
    return 0


def _roundtrip(args: argparse.Namespace) -> int:
    """Quantize a default random weight at every k and report SQNR and size: a quick self-check."""
    import torch

    from kbit_vllm import normal_float_codebook, ops

    torch.manual_seed(args.seed)
    w = torch.randn(args.rows, args.cols)
    x = torch.randn(4, args.cols)
    ref = x.double() @ w.double().t()
    print(f"weight {args.rows}x{args.cols} fp32, {w.numel() * 2 / 2**20:.2f} MiB in fp16")
    print(f"{'bits':>4} {'MiB':>7} {'weight SQNR dB':>15} {'linear rel err':>15}")
    for k in (2, 3, 4, 5):
        cb = normal_float_codebook(k)
        packed, absmax = ops.kbit_quantize(w, cb, k)
        wq = ops.kbit_dequantize(packed, absmax, cb, k, torch.float32)
        sqnr = 10 * torch.log10(w.square().sum() / (w - wq).square().sum())
        pt, at = ops.kbit_repack(packed, absmax, k)
        y = ops.kbit_linear(x, pt, at, cb, None, k, args.rows)
        rel = (y.double() - ref).norm() / ref.norm()
        mib = (packed.numel() * 4 + absmax.numel()) / 2**20
        print(f"{k:>4} {mib:>7.2f} {float(sqnr):>15.2f} {float(rel):>15.4f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kbit-vllm", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="versions, CUDA library status and archs").set_defaults(fn=_info)
    rt = sub.add_parser("roundtrip", help="quantize a random weight at k=2..5 and report the error")
    rt.add_argument("--rows", type=int, default=1024)
    rt.add_argument("--cols", type=int, default=1024)
    rt.add_argument("--seed", type=int, default=0)
    rt.set_defaults(fn=_roundtrip)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
