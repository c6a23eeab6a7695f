"""Registers each device's implementation of the kbit_vllm:: ops.

CPU: the PyTorch reference, with PyTorch's fused int4 matmul for AWQ, table-lookup
dequantization for the kbit linear ops (cpu/kbit_tables.py) and a binary-search kbit_quantize
(cpu/kbit_encode.py). CUDA: the compiled
library's kernels where they exist and the library serves this GPU; the reference otherwise,
after one warning (an error under KBIT_VLLM_STRICT=1, see cuda/library.py).
awq_orin keeps its own CUDA resident layout (cuda/awq_ops.py) on every GPU, so its CUDA ops
always go through awq_ops, which falls back to PyTorch math on that layout.
"""

from __future__ import annotations

import torch

from . import reference as ref
from .cpu import int4pack, kbit_encode, kbit_tables
from .cuda import awq_ops, library, moe_experts, moe_ops
from .cuda import ops as cuda_ops

_REFERENCE_OPS = (
    "kbit_quantize", "kbit_dequantize", "kbit_repack", "kbit_unrepack", "kbit_linear",
    "kbit_grouped_linear", "awq_dequantize", "awq_repack", "awq_unrepack", "awq_linear",
    "awq_grouped_linear", "moe_route", "moe_gather", "moe_route_gather", "moe_gated_act", "moe_combine",
    "kbit_moe_experts",
)
_CUDA_KERNEL_OPS = ("kbit_quantize", "kbit_dequantize", "kbit_repack", "kbit_unrepack", "kbit_linear",
                    "kbit_grouped_linear")
_CUDA_MOE_OPS = ("moe_route", "moe_gather", "moe_route_gather", "moe_gated_act", "moe_combine")
_CUDA_FUSED_OPS = ("kbit_moe_experts",)
_CUDA_AWQ_OPS = ("awq_repack", "awq_unrepack", "awq_linear", "awq_grouped_linear")

_registered = False
_LIB = torch.library.Library("kbit_vllm", "IMPL")


def awq_resident_shape(device: torch.device, in_features: int, out_features: int,
                       group_size: int) -> tuple[tuple[int, int], torch.dtype]:
    """Shape and dtype of awq_repack's wq on this device (see ops.py)."""
    if device.type == "cpu":
        return int4pack.resident_shape(in_features, out_features, group_size)
    if device.type == "cuda":
        return (out_features // 8, in_features), torch.int32
    return (in_features, out_features // 8), torch.int32


def _cuda_dispatch(name: str):
    module = moe_ops if name in _CUDA_MOE_OPS else moe_experts if name in _CUDA_FUSED_OPS else cuda_ops
    kernel = getattr(module, name)
    fallback = getattr(ref, name)

    def impl(*args):
        dev = next(a.device for a in args if isinstance(a, torch.Tensor))
        if library.kernels_usable(dev.index):  # warns once (or raises in strict mode) if not
            return kernel(*args)
        return fallback(*args)

    return impl


def register() -> None:
    """Register all implementations once (idempotent)."""
    global _registered
    if _registered:
        return
    for name in _REFERENCE_OPS:
        cpu_module = int4pack if name.startswith("awq_") else kbit_encode if name == "kbit_quantize" else kbit_tables
        cpu_impl = getattr(cpu_module, name, None)
        _LIB.impl(name, cpu_impl or getattr(ref, name), "CPU")
        if name in _CUDA_AWQ_OPS:
            cuda_impl = getattr(awq_ops, name)
        elif name in _CUDA_KERNEL_OPS or name in _CUDA_MOE_OPS or name in _CUDA_FUSED_OPS:
            cuda_impl = _cuda_dispatch(name)
        else:
            cuda_impl = getattr(ref, name)
        _LIB.impl(name, cuda_impl, "CUDA")
    _registered = True
