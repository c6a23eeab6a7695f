"""Whether this machine can run the CUDA kernel tests: a GPU that the compiled library serves."""

from __future__ import annotations

import torch

from kbit_vllm.backends.cuda import library


def cuda_kernels_ok() -> tuple[bool, str]:
    """(usable, why not) for the current CUDA device."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    return library.device_supported(torch.cuda.current_device())
