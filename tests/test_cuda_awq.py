"""awq_orin CUDA kernels against the float64 AWQ reference (skipped without a GPU + library)."""

from __future__ import annotations

import pytest
import torch

import kbit_vllm
from kbit_vllm import ops
from kbit_vllm.formats import quantize_awq_rtn, unpack_awq

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not kbit_vllm.cuda_library_status().loaded, reason="needs the compiled CUDA library"),
]

DTYPES = (torch.float16, torch.bfloat16)
# Max-norm relative error vs float64: weights and products are rounded to the activation dtype
# (fp16 2^-11, bf16 2^-8 relative) and summed in fp32; scales/biases rounded once more.
TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2}
M_VALUES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 64, 100, 1000)


def _poison_allocator(nbytes: int) -> None:
    """Fill freed allocator blocks with NaN so an output the kernel forgets to write shows up."""
    torch.full((nbytes // 2 + 1024,), float("nan"), dtype=torch.float16, device="cuda")


def _w64(qw, qz, s, gs):
    q = unpack_awq(qw).double()
    z = unpack_awq(qz).double().repeat_interleave(gs, dim=0)
    return ((q - z) * s.double().repeat_interleave(gs, dim=0)).t()


def _rel(y, ref):
    return float((y.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gs,in_f", [(32, 320), (64, 320), (128, 384), (128, 4096)])
def test_awq_linear_matches_reference(dtype: torch.dtype, gs: int, in_f: int) -> None:
    out_f = 264  # 33 column groups
    w = torch.randn(out_f, in_f, device="cuda")
    qw, qz, s = quantize_awq_rtn(w, gs, scale_dtype=dtype)
    wq, sz = ops.awq_repack(qw, qz, s, gs, dtype)
    ref_w = _w64(qw, qz, s, gs)
    bias = torch.randn(out_f, device="cuda", dtype=dtype)
    for m in M_VALUES:
        x = torch.randn(m, in_f, device="cuda", dtype=dtype)
        _poison_allocator(max(m, out_f) * max(in_f, out_f) * 2)
        y = ops.awq_linear(x, wq, sz, bias if m % 2 else None, gs, out_f)
        ref = x.double() @ ref_w.t() + (bias.double() if m % 2 else 0)
        assert torch.isfinite(y).all(), f"M={m}: unwritten output"
        assert _rel(y, ref) < TOL[dtype], f"M={m} gs={gs}: rel err {_rel(y, ref):.2e}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_awq_leading_dims_and_dequantize(dtype: torch.dtype) -> None:
    qw, qz, s = quantize_awq_rtn(torch.randn(128, 256, device="cuda"), 64, scale_dtype=dtype)
    wq, sz = ops.awq_repack(qw, qz, s, 64, dtype)
    x = torch.randn(2, 3, 256, device="cuda", dtype=dtype)
    y = ops.awq_linear(x, wq, sz, None, 64, 128)
    assert y.shape == (2, 3, 128)
    ref = x.double() @ _w64(qw, qz, s, 64).t()
    assert _rel(y, ref) < TOL[dtype]
    assert _rel(ops.awq_dequantize(qw, qz, s, 64), _w64(qw, qz, s, 64)) < 1e-2


@pytest.mark.parametrize("m", [1, 8, 64])
def test_awq_cuda_graph_replay(m: int) -> None:
    dtype = torch.float16
    qw, qz, s = quantize_awq_rtn(torch.randn(512, 1024, device="cuda"), 128)
    wq, sz = ops.awq_repack(qw, qz, s, 128, dtype)
    x = torch.randn(m, 1024, device="cuda", dtype=dtype)
    eager = ops.awq_linear(x, wq, sz, None, 128, 512)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ops.awq_linear(x, wq, sz, None, 128, 512)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, ops.awq_linear(x, wq, sz, None, 128, 512))
    assert not torch.equal(y, eager)
