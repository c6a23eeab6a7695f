"""`kbit-vllm roundtrip`: quantize a random weight at k=2..5 and report the error (a quick self-check)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("roundtrip", help="quantize a random weight at k=2..5 and report the error")
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    return p


def run(args: argparse.Namespace) -> int:
    """No model, no download: checks the ops end to end on whatever device torch picks."""
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
