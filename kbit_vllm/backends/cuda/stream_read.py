"""The read-only stream kernel (csrc/stream_read.cu): what reading a tensor's bytes costs, measured.

Not an op of the package: benchmarks/bench_floor.py times it beside the GEMVs, under the same
harness, as the cost any kernel pays to read the same weights (launch, DRAM latency and the wave's
tail included); the tests check it reads every byte.
"""

from __future__ import annotations

import ctypes

import torch

from .cargs import cint, ptr, stream
from .library import LIB, check, sm_count

UNROLLS = (2, 4, 8)
"""Loads in flight per thread that the kernel is built for."""


def ctas_per_sm(unroll: int) -> int:
    """CTAs of the read kernel one SM holds at this unroll (0 where the library cannot say)."""
    if unroll not in UNROLLS:
        raise ValueError(f"stream_read: unroll must be one of {UNROLLS}, got {unroll}")
    return int(LIB.kbit_vllm_stream_read_ctas_per_sm(cint(unroll)))


def stream_read(t: torch.Tensor, sink: torch.Tensor, ctas: int, unroll: int = 4, wait_first: bool = False
                ) -> torch.Tensor:
    """Read every byte of CUDA tensor t with `ctas` CTAs; CTA b writes the XOR of the 32-bit words it
    read into sink[b] (int32, at least ctas elements). Returns sink. t must be contiguous, 16-byte
    aligned and a multiple of 16 bytes (weight tensors of the tiled layouts are). Launched with PDL
    like the GEMVs: the reads overlap the kernel before unless wait_first (only the sink store waits),
    as a dense layer's weights may; wait_first reads only once it is done, as a MoE layer's experts,
    known from the routing written just before, must."""
    nbytes = t.numel() * t.element_size()
    if not t.is_cuda or not t.is_contiguous() or t.data_ptr() % 16 or nbytes % 16:
        raise ValueError(f"stream_read: t must be a contiguous CUDA tensor, 16-byte aligned, of a multiple of 16 "
                         f"bytes; got device {t.device}, contiguous={t.is_contiguous()}, address "
                         f"{t.data_ptr():#x}, {nbytes} bytes")
    if sink.dtype != torch.int32 or sink.device != t.device or not sink.is_contiguous() or sink.numel() < ctas:
        raise ValueError(f"stream_read: sink must be a contiguous int32 tensor of at least ctas={ctas} elements on "
                         f"{t.device}, got {sink.dtype} [{sink.numel()}] on {sink.device}")
    if ctas < 1 or unroll not in UNROLLS:
        raise ValueError(f"stream_read: ctas must be >= 1 and unroll one of {UNROLLS}, got {ctas}, {unroll}")
    check(LIB.kbit_vllm_stream_read(ptr(t), ctypes.c_longlong(nbytes), ptr(sink), cint(ctas), cint(unroll),
                                    cint(int(wait_first)), stream(t.device)), "stream_read")
    return sink


def one_wave(device: torch.device, unroll: int, per_sm: int | None = None) -> int:
    """CTAs for a grid of per_sm CTAs on every SM (the resident maximum when None)."""
    per = ctas_per_sm(unroll) if per_sm is None else per_sm
    return max(1, per) * sm_count(device)
