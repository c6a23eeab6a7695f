"""Whether this machine can run the CUDA kernel tests: a GPU that the compiled library serves."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from kbit_vllm.backends.cuda import library


def cuda_kernels_ok() -> tuple[bool, str]:
    """(usable, why not) for the current CUDA device."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    return library.device_supported(torch.cuda.current_device())


def poison_allocator(nbytes: int) -> None:
    """Leave freed cached blocks of at least nbytes full of 0xFF bytes, so outputs that torch.empty
    hands out next start as NaN (fp16, bf16, fp32) or -1 (integers): an element a kernel never
    writes shows up."""
    torch.empty(nbytes + 2048, dtype=torch.uint8, device="cuda").fill_(0xFF)


def max_norm_rel_err(y: torch.Tensor, want: torch.Tensor) -> float:
    """max |y - want| / max |want| in float64 (the denominator floored at 1e-6): the error bound the
    CUDA kernel tests check against their float64 references."""
    return float((y.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-6))


def assert_close_max_norm(y: torch.Tensor, want: torch.Tensor, tol: float, what: str = "output") -> None:
    """y has no NaN (an unwritten, poisoned output) and its max-norm relative error is below tol."""
    assert not torch.isnan(y).any(), f"{what}: NaN output (unwritten, or an input read too early)"
    err = max_norm_rel_err(y, want)
    assert err < tol, f"{what}: max-norm relative error {err:.3g}"


_Out = TypeVar("_Out")


def at_odd_offset(t: torch.Tensor) -> torch.Tensor:
    """A copy of t that is a view 4 bytes past a 16-byte boundary (as a slice of a larger weight
    can be): what the ops must not hand to kernels that read 16-byte vectors."""
    pad = max(1, 4 // t.element_size())
    buf = torch.empty(t.numel() + pad, dtype=t.dtype, device=t.device)
    odd = buf[pad:].view(t.shape).copy_(t)
    assert odd.data_ptr() % 16, "the copy must sit at an address that is no multiple of 16"
    return odd


def captured(call: Callable[[], _Out], warmups: int = 1) -> tuple[torch.CUDAGraph, _Out]:
    """(graph, its output) of call captured once, after warmups calls on a side stream (the lazy
    set-up an op does on its first calls, such as occupancy queries and scratch buffers, stays out
    of the capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmups):
            call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = call()
    return g, y
