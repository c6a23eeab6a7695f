"""CUDA implementations of the kbit_vllm:: ops: argument marshalling into the C API.

Kernels launch on torch's current stream and never allocate: outputs and scratch are torch
tensors made here. Ops without a kernel yet run the reference PyTorch path on the GPU.
"""

from __future__ import annotations

import ctypes

import torch

from ... import op_checks as C
from ...formats import block_absmax, check_block_absmax
from .library import LIB, check

_QUANT_FN = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _stream(device: torch.device) -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def kbit_quantize(weight: torch.Tensor, codebook: torch.Tensor, k: int):
    C.check_quantize(weight, codebook, k)
    check_block_absmax(block_absmax(weight))  # load-time only: a host sync is acceptable here
    w = weight.contiguous()
    out_f, in_f = w.shape
    packed = torch.empty((out_f, in_f // 32 * k), dtype=torch.int32, device=w.device)
    absmax = torch.empty((out_f, in_f // 32), dtype=torch.uint8, device=w.device)
    if w.numel():
        with torch.cuda.device(w.device):
            fn = getattr(LIB, f"kbit_vllm_quantize_{_QUANT_FN[w.dtype]}")
            check(fn(_ptr(w), _ptr(codebook.contiguous()), ctypes.c_int(k), ctypes.c_int(out_f),
                     ctypes.c_int(in_f), _ptr(packed), _ptr(absmax), _stream(w.device)), "kbit_quantize")
    return packed, absmax
