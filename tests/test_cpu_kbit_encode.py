"""The CPU kbit_quantize (backends/cpu/kbit_encode.py) gives the reference's codes exactly."""

from __future__ import annotations

import pytest
import torch

import kbit_vllm  # noqa: F401  (registers the op implementations)
from kbit_vllm import ops
from kbit_vllm.backends.cpu import kbit_encode
from kbit_vllm.formats import kbit as kbit_fmt
from kbit_vllm.formats import normal_float_codebook


def _hard_values(cb: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random values plus every entry, every midpoint and their float32 neighbours, signed zeros
    and values past both ends: where a search could disagree with the argmin."""
    mids = (cb[1:] + cb[:-1]) / 2
    edges = torch.cat([cb, mids, torch.tensor([0.0, -0.0, 1.5, -1.5, 1e-30])])
    up, down = edges.nextafter(torch.tensor(float("inf"))), edges.nextafter(torch.tensor(float("-inf")))
    rand = torch.rand(4096, generator=gen) * 3.2 - 1.6
    return torch.cat([edges, up, down, rand]).view(-1, 1)


@pytest.mark.parametrize("k", (2, 3, 4, 5))
def test_nearest_codes_is_the_argmin(k: int, gen: torch.Generator) -> None:
    for cb in (normal_float_codebook(k), torch.sort(torch.randn(1 << k, generator=gen)).values):
        x = _hard_values(cb, gen)
        assert kbit_encode._qualifies(x, cb)
        assert torch.equal(kbit_encode.search_codes(x, cb), kbit_fmt.nearest_codes(x, cb))
        assert torch.equal(kbit_encode.nearest_codes(x, cb), kbit_fmt.nearest_codes(x, cb))


def test_codebooks_the_search_cannot_serve_take_the_argmin(gen: torch.Generator) -> None:
    x = _hard_values(normal_float_codebook(3), gen)
    unsorted = torch.tensor([0.5, -1.0, 1.0, 0.0, -0.5, 0.75, -0.75, 0.25])
    close = torch.tensor([-1.0, -0.5, -0.25, 0.0, 0.25, 0.25 + 1e-7, 0.5, 1.0])  # within a rounding step
    tied = torch.tensor([-1.0, -0.5, -0.25, 0.0, 0.0, 0.25, 0.5, 1.0])
    for cb in (unsorted, close, tied):
        assert not kbit_encode._qualifies(x, cb)
        assert torch.equal(kbit_encode.nearest_codes(x, cb), kbit_fmt.nearest_codes(x, cb))


@pytest.mark.parametrize("k", (2, 3, 4, 5))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_quantize_op_is_the_reference(k: int, dtype: torch.dtype, gen: torch.Generator) -> None:
    w = (torch.randn(96, 256, generator=gen) * torch.rand(96, 1, generator=gen) * 4).to(dtype)
    w[3, :32] = 0  # an all-zero block
    w[5, 32:64] *= 1e-4  # a block whose scale is an E4M4 subnormal
    cb = normal_float_codebook(k)
    packed, absmax = ops.kbit_quantize(w, cb, k)
    ref_packed, ref_absmax = kbit_fmt.quantize_kbit(w, cb, k)
    assert torch.equal(packed, ref_packed) and torch.equal(absmax, ref_absmax)
