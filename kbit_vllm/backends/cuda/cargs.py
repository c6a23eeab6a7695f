"""ctypes argument marshalling shared by the CUDA op modules (kbit, awq, MoE glue)."""

from __future__ import annotations

import ctypes

import torch

SUFFIX = {torch.float16: "fp16", torch.bfloat16: "bf16"}
"""C API suffix of each activation dtype the kernels take."""


def ptr(t: torch.Tensor | None) -> ctypes.c_void_p:
    """A tensor's data pointer (NULL for None)."""
    return ctypes.c_void_p(0 if t is None else t.data_ptr())


def cint(v: int) -> ctypes.c_int:
    return ctypes.c_int(int(v))


def stream(device: torch.device) -> ctypes.c_void_p:
    """torch's current stream on device: every kernel launches there."""
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)
