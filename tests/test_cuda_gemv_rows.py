"""The row-slice GEMV (csrc/kbit_gemv_rows.cu: M=1, k <= 4, a CTA per 8 / 16 / 32 / 64 output rows over the
whole K) against the float64 product of the reference's dequantized weights. Fresh random inputs each
run; the output is poisoned first (the kernel writes every row below out, and only those). Skips
cleanly without a CUDA GPU or a library built for it. Error bound as test_cuda_kbit.py's table GEMVs:
fp16 partial sums of 16 products per half (x scaled below 2^10) flushed to fp32 once per block.
"""

from __future__ import annotations

import pytest
import torch
from cuda_helpers import assert_close_max_norm, captured, cuda_kernels_ok, poison_allocator

from kbit_vllm import ops
from kbit_vllm.formats import dequantize_kbit, normal_float_codebook, quantize_kbit

_OK, _WHY = cuda_kernels_ok()
pytestmark = pytest.mark.skipif(not _OK, reason=f"CUDA kbit kernels unavailable: {_WHY}")
if _OK:
    from kbit_vllm.backends.cuda import dispatch
    from kbit_vllm.backends.cuda import ops as cuda_ops

DEV = "cuda"
TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _layer(out_f: int, in_f: int, k: int):
    w = torch.randn(out_f, in_f, device=DEV) * torch.rand(out_f, 1, device=DEV)
    cb = normal_float_codebook(k).to(DEV)
    packed, absmax = quantize_kbit(w, cb, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    return pt, at, cb, dequantize_kbit(packed, absmax, cb, k, torch.float64)


def _want(x: torch.Tensor, w64: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    want = x.double() @ w64.t()
    return want if bias is None else want + bias.double()


@pytest.mark.parametrize("k", (2, 3, 4))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize("rows", (8, 16, 32, 64))
# (in, out): a padded last tile and slices past out (out = 200, 1000), one block (32), nb not a
# multiple of the CTA's 128 / 64 / 32 / 16 blocks at once (4128), the staging limit (16384 inputs).
# k = 3, 4 request four blocks a lane group at a time from 96 blocks (kbit_gemv_rows.cu rows_depth): 3040
# inputs (95 blocks) run one at a time; 4128 and 16384 take more than one batch of four at some slices.
@pytest.mark.parametrize("in_f,out_f", ((32, 200), (3040, 1000), (4128, 1000), (16384, 96), (4096, 4096)))
def test_gemv_rows_against_reference(k, dtype, rows, in_f, out_f):
    pt, at, cb, w64 = _layer(out_f, in_f, k)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    for b in (None, bias):
        x = torch.randn(1, in_f, device=DEV, dtype=dtype)
        poison_allocator(out_f * 2)
        y = cuda_ops.linear_path(x, pt, at, cb, b, k, out_f, f"gemv_rows{rows}")
        assert y.shape == (1, out_f) and y.dtype == dtype
        assert_close_max_norm(y, _want(x, w64, b), TOL[dtype], f"gemv_rows{rows}")


@pytest.mark.parametrize("k", (2, 4))
def test_gemv_rows_bf16_magnitudes_and_determinism(k):
    """bf16 x of any magnitude runs as fp16 times one power of two per CTA (|x| 2^-20..2^20 with
    blocks stepped apart inside a row); the sums meet in a fixed order, so repeated calls agree
    bit for bit."""
    in_f, out_f = 4096, 2048
    pt, at, cb, w64 = _layer(out_f, in_f, k)
    stepped = torch.pow(2.0, 3.0 * (torch.arange(in_f, device=DEV) // 32 % 5))
    for e in (-20, 0, 20):
        x = (torch.randn(1, in_f, device=DEV) * 2.0**e * stepped / 64).to(torch.bfloat16)
        y = cuda_ops.linear_path(x, pt, at, cb, None, k, out_f, "gemv_rows")
        assert torch.isfinite(y).all()
        assert_close_max_norm(y, _want(x, w64, None), TOL[torch.bfloat16], f"gemv_rows 2^{e}")
        assert torch.equal(y, cuda_ops.linear_path(x, pt, at, cb, None, k, out_f, "gemv_rows"))


def test_gemv_rows_graph_replay_matches_eager():
    in_f, out_f, k = 4096, 6144, 4
    pt, at, cb, _ = _layer(out_f, in_f, k)
    x = torch.randn(1, in_f, device=DEV, dtype=torch.bfloat16)
    eager = cuda_ops.linear_path(x, pt, at, cb, None, k, out_f, "gemv_rows")
    graph, out = captured(lambda: cuda_ops.linear_path(x, pt, at, cb, None, k, out_f, "gemv_rows"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_gemv_rows_refuses_what_it_cannot_run():
    """M > 1, k = 5, more inputs than the staging slots hold, or a slice that is not 8 / 16 / 32 / 64: a
    clear error naming the path, never a wrong result."""
    pt, at, cb, _ = _layer(256, 64, 4)
    with pytest.raises(ValueError, match="gemv_rows"):
        cuda_ops.linear_path(torch.randn(2, 64, device=DEV, dtype=torch.float16), pt, at, cb, None, 4, 256, "gemv_rows")
    with pytest.raises(ValueError, match="gemv_rows"):
        cuda_ops.linear_path(torch.randn(1, 64, device=DEV, dtype=torch.float16), pt, at, cb, None, 4, 256,
                             "gemv_rows24")
    with pytest.raises(ValueError, match="unknown kbit_linear path 'gemv_rowsx'"):
        cuda_ops.linear_path(torch.randn(1, 64, device=DEV, dtype=torch.float16), pt, at, cb, None, 4, 256,
                             "gemv_rowsx")
    big = (dispatch.ROWS_MAX_BLOCKS + 1) * 32
    pt2, at2, cb2, _ = _layer(128, big, 4)
    with pytest.raises(ValueError, match="gemv_rows"):
        cuda_ops.linear_path(torch.randn(1, big, device=DEV, dtype=torch.float16), pt2, at2, cb2, None, 4, 128,
                             "gemv_rows")


@pytest.mark.parametrize("k,in_f,out_f", ((4, 2048, 2048), (2, 4096, 4096), (3, 3072, 512)))
def test_op_takes_gemv_rows_where_the_rules_say(k, in_f, out_f):
    """kbit_linear at M=1 runs the row-slice GEMV on the layers dispatch.ROWS_RULES gives it (the same
    bits as the forced path with the op's slice), and its result is right."""
    dev = torch.device(DEV)
    if not dispatch.use_gemv_rows(k, in_f, out_f, torch.cuda.get_device_capability(dev)):
        pytest.skip("no row-slice GEMV rule for this layer on this GPU")
    pt, at, cb, w64 = _layer(out_f, in_f, k)
    x = torch.randn(1, in_f, device=DEV, dtype=torch.bfloat16)
    poison_allocator(out_f * 2)
    y = ops.kbit_linear(x, pt, at, cb, None, k, out_f)
    assert_close_max_norm(y, _want(x, w64, None), TOL[torch.bfloat16], "kbit_linear M=1")
    assert torch.equal(y, cuda_ops.linear_path(x, pt, at, cb, None, k, out_f, "gemv_rows"))


def test_gemv_rows_occupancy_sizes_the_slice():
    """The library reports the row-slice kernel's resident CTAs an SM for the kernel it runs: three with
    one block a lane group in flight (k = 2; k = 3, 4 below 96 input blocks), two with four (k = 3, 4
    from 96 blocks: 126-128 registers), 0 for what it does not take; the op's slice keeps the grid
    inside one wave of them."""
    dev = torch.device(DEV)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for dtype in (torch.float16, torch.bfloat16):
        fn = getattr(cuda_ops.LIB, f"kbit_vllm_gemv_rows_ctas_per_sm_{cuda_ops.SUFFIX[dtype]}")
        for rows in dispatch.ROWS_SLICES:
            assert fn(2, 128, rows) == 3
            assert fn(4, 95, rows) == 3 and fn(3, 95, rows) == 3
            assert fn(4, 96, rows) == 2 and fn(3, 512, rows) == 2
            assert fn(5, 128, rows) == 0 and fn(4, dispatch.ROWS_MAX_BLOCKS + 1, rows) == 0
        assert fn(4, 128, 24) == 0
        for k, nb, out_f in ((4, 128, 8448), (4, 128, 8480), (2, 128, 12704), (3, 256, 16896)):
            rows = cuda_ops.gemv_rows_slice(dev, dtype, k, out_f, nb)
            assert rows in dispatch.ROWS_SLICES
            assert -(-out_f // rows) <= fn(k, nb, rows) * sms, (k, nb, out_f, rows)
