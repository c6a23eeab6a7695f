"""awq_orin CUDA kernels against the float64 AWQ reference (skipped without a GPU + library)."""

from __future__ import annotations

import pytest
import torch
from cuda_helpers import at_odd_offset, captured, max_norm_rel_err, poison_allocator

import kbit_vllm
from kbit_vllm import ops
from kbit_vllm.backends.cuda import awq_ops
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


def _w64(qw, qz, s, gs):
    q = unpack_awq(qw).double()
    z = unpack_awq(qz).double().repeat_interleave(gs, dim=0)
    return ((q - z) * s.double().repeat_interleave(gs, dim=0)).t()


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
        poison_allocator(max(m, out_f) * max(in_f, out_f) * 2)
        y = ops.awq_linear(x, wq, sz, bias if m % 2 else None, gs, out_f)
        ref = x.double() @ ref_w.t() + (bias.double() if m % 2 else 0)
        assert torch.isfinite(y).all(), f"M={m}: unwritten output"
        assert max_norm_rel_err(y, ref) < TOL[dtype], f"M={m} gs={gs}: rel err {max_norm_rel_err(y, ref):.2e}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_awq_leading_dims_and_dequantize(dtype: torch.dtype) -> None:
    qw, qz, s = quantize_awq_rtn(torch.randn(128, 256, device="cuda"), 64, scale_dtype=dtype)
    wq, sz = ops.awq_repack(qw, qz, s, 64, dtype)
    x = torch.randn(2, 3, 256, device="cuda", dtype=dtype)
    y = ops.awq_linear(x, wq, sz, None, 64, 128)
    assert y.shape == (2, 3, 128)
    ref = x.double() @ _w64(qw, qz, s, 64).t()
    assert max_norm_rel_err(y, ref) < TOL[dtype]
    assert max_norm_rel_err(ops.awq_dequantize(qw, qz, s, 64), _w64(qw, qz, s, 64)) < 1e-2


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
    again = ops.awq_linear(x, wq, sz, None, 128, 512)  # equal up to float-atomic order (stream-K kernels)
    assert (y.double() - again.double()).abs().max() <= 1e-3 * again.double().abs().max()
    assert not torch.equal(y, eager)


# --- stream-K GEMV (csrc/awq_gemv_sk.cu; unit = 8-output column group x 512 inputs) -------------
# (in, out): one partial unit per column group and fewer units than a wave (384 x 264, 33 groups);
# a masked tail unit, odd group counts (1152: 9 groups of 128; 2720: 85 of 32); many units per
# warp with split column groups (4096 x 4096); 28 warps per column group (14336 x 512).
SK_SHAPES = ((384, 264), (1152, 1000), (2720, 64), (4096, 4096), (14336, 512))
BIG = (4096, 12288)  # enough units per warp of a wave for the auto "gemv" path to take stream-K
_SFX = {torch.float16: "fp16", torch.bfloat16: "bf16"}


@pytest.mark.parametrize("m", (1, 3, 64))
def test_awq_linear_weights_at_unaligned_offset(m: int) -> None:
    """Weights that are views at a 4-byte (not 16-byte) offset give the reference's output: the op
    copies them before any kernel's 16-byte loads."""
    dtype = torch.bfloat16
    qw, qz, s = quantize_awq_rtn(torch.randn(512, 1024, device="cuda"), 128, scale_dtype=dtype)
    wq, sz = ops.awq_repack(qw, qz, s, 128, dtype)
    x = torch.randn(m, 1024, device="cuda", dtype=dtype)
    y = ops.awq_linear(x, at_odd_offset(wq), at_odd_offset(sz), None, 128, 512)
    err = max_norm_rel_err(y, x.double() @ _w64(qw, qz, s, 128).t())
    assert err < TOL[dtype], f"M={m}: rel err {err:.2e}"


def _awq_layer(out_f: int, in_f: int, gs: int, dtype: torch.dtype):
    qw, qz, s = quantize_awq_rtn(torch.randn(out_f, in_f, device="cuda"), gs, scale_dtype=dtype)
    wq, sz = ops.awq_repack(qw, qz, s, gs, dtype)
    return wq, sz, _w64(qw, qz, s, gs)


def _check(y, x, w64, bias, dtype, what: str) -> None:
    ref = x.double() @ w64.t() + (bias.double() if bias is not None else 0)
    assert y.shape == ref.shape and y.dtype == dtype
    assert torch.isfinite(y).all(), f"{what}: unwritten output"
    assert max_norm_rel_err(y, ref) < TOL[dtype], f"{what}: rel err {max_norm_rel_err(y, ref):.2e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gs", (32, 64, 128))
@pytest.mark.parametrize("in_f,out_f", SK_SHAPES)
def test_gemv_sk_matches_reference(dtype: torch.dtype, gs: int, in_f: int, out_f: int) -> None:
    """Stream-K GEMV, warp GEMV and the auto GEMV path against float64, M = 1..4, with and without
    bias, on outputs poisoned with NaN first."""
    if in_f % gs:
        pytest.skip(f"in {in_f} is no multiple of group {gs}")
    wq, sz, w64 = _awq_layer(out_f, in_f, gs, dtype)
    bias = torch.randn(out_f, device="cuda", dtype=dtype)
    for m in (1, 2, 3, 4):
        x = torch.randn(m, in_f, device="cuda", dtype=dtype)
        for b in (bias, None):
            for path in ("gemv_sk", "gemv_warp", "gemv"):
                poison_allocator(m * out_f * 2)
                y = awq_ops.linear_path(x, wq, sz, b, gs, out_f, path)
                _check(y, x, w64, b, dtype, f"{path} M={m} bias={b is not None}")


def test_gemv_sk_rejects_what_it_cannot_run() -> None:
    wq, sz, _ = _awq_layer(8, 512, 128, torch.float16)  # one unit: fewer than a CTA's 8 warps
    with pytest.raises(ValueError, match="gemv_sk"):
        awq_ops.linear_path(torch.randn(1, 512, device="cuda", dtype=torch.float16), wq, sz, None, 128, 8, "gemv_sk")
    wq, sz, _ = _awq_layer(256, 1024, 128, torch.float16)
    with pytest.raises(ValueError, match="gemv_sk"):  # instantiated for M <= 4
        awq_ops.linear_path(torch.randn(5, 1024, device="cuda", dtype=torch.float16), wq, sz, None, 128, 256,
                            "gemv_sk")


@pytest.fixture(scope="module", params=DTYPES, ids=["fp16", "bf16"])
def big_layer(request):
    dtype = request.param
    in_f, out_f = BIG
    wq, sz, w64 = _awq_layer(out_f, in_f, 128, dtype)
    return dtype, wq, sz, w64


def test_gemv_auto_path_takes_stream_k(big_layer, monkeypatch) -> None:
    """On a large layer the op's GEMV at M = 2..4 is the stream-K kernel (outside deterministic mode;
    M = 1 keeps the warp GEMV), and right."""
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "0")
    dtype, wq, sz, w64 = big_layer
    in_f, out_f = BIG
    bias = torch.randn(out_f, device="cuda", dtype=dtype)
    assert awq_ops.gemv_sk_ctas(torch.device("cuda"), _SFX[dtype], 1, in_f, out_f) == 0  # M=1: warp GEMV
    for m in (1, 2, 3, 4):
        assert m == 1 or awq_ops.gemv_sk_ctas(torch.device("cuda"), _SFX[dtype], m, in_f, out_f) > 0
        x = torch.randn(m, in_f, device="cuda", dtype=dtype)
        poison_allocator(m * out_f * 2)
        _check(ops.awq_linear(x, wq, sz, bias, 128, out_f), x, w64, bias, dtype, f"op M={m}")


def test_gemv_deterministic_mode_uses_warp_gemv(big_layer, monkeypatch) -> None:
    """KBIT_VLLM_DETERMINISTIC=1: the op's GEMV is the warp GEMV (fixed order): same bits every call."""
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "1")
    dtype, wq, sz, w64 = big_layer
    in_f, out_f = BIG
    for m in (1, 3):
        x = torch.randn(m, in_f, device="cuda", dtype=dtype)
        first = ops.awq_linear(x, wq, sz, None, 128, out_f)
        _check(first, x, w64, None, dtype, f"deterministic M={m}")
        assert torch.equal(first, awq_ops.linear_path(x, wq, sz, None, 128, out_f, "gemv_warp"))
        for _ in range(3):
            assert torch.equal(ops.awq_linear(x, wq, sz, None, 128, out_f), first)


@pytest.mark.parametrize("m", (1, 2, 4))
def test_gemv_sk_graph_replay(big_layer, m: int, monkeypatch) -> None:
    """Graph replays of the op (stream-K GEMV) equal eager within the float-atomic order, every
    replay is right (accumulators and counters are left zeroed), and a replay reads new x."""
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "0")
    dtype, wq, sz, w64 = big_layer
    in_f, out_f = BIG
    bias = torch.randn(out_f, device="cuda", dtype=dtype)
    x = torch.randn(m, in_f, device="cuda", dtype=dtype)

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return bool(((a.double() - b.double()).abs().max() / b.double().abs().max()) < 1e-2)

    eager = ops.awq_linear(x, wq, sz, bias, 128, out_f)
    g, y = captured(lambda: ops.awq_linear(x, wq, sz, bias, 128, out_f), warmups=2)
    for _ in range(3):
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert close(y, eager)
        _check(y, x, w64, bias, dtype, f"replay M={m}")
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert close(y, ops.awq_linear(x, wq, sz, bias, 128, out_f))
    _check(y, x, w64, bias, dtype, f"replay with new x M={m}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", (1, 3, 4))
@pytest.mark.parametrize("in_f,out_f", ((4096, 1000), (14336, 512)))
def test_gemv_sk_nonfinite_rows(dtype: torch.dtype, m: int, in_f: int, out_f: int) -> None:
    """An Inf or NaN in one row of x makes only that row's outputs non-finite, and the next call
    (same scratch) is right again: the last warp of a tile re-zeroes a NaN accumulator."""
    wq, sz, w64 = _awq_layer(out_f, in_f, 128, dtype)
    x = torch.randn(m, in_f, device="cuda", dtype=dtype)
    x[0, 7] = float("inf")
    if m > 1:
        x[m - 1, in_f - 100] = float("nan")
    y = awq_ops.linear_path(x, wq, sz, None, 128, out_f, "gemv_sk")
    torch.cuda.synchronize()
    assert not torch.isfinite(y[0]).any()
    if m > 1:
        assert torch.isnan(y[m - 1]).all()
    if m > 2:
        _check(y[1 : m - 1], x[1 : m - 1], w64, None, dtype, "finite rows")
    x2 = torch.randn(m, in_f, device="cuda", dtype=dtype)
    _check(awq_ops.linear_path(x2, wq, sz, None, 128, out_f, "gemv_sk"), x2, w64, None, dtype, "after non-finite")


# --- Hopper tensor-core GEMV (csrc/awq_gemv_tc.cu; stream-K unit = 64 outputs x 64 inputs, M <= 8) ----
# (in, out): a half unit at the end of K (2720) with a partial last tile (1000 = 15 x 64 + 40);
# a few units per warp (320 x 264); one tile's K split over many warps (14336 x 256); many tiles.
TC_SHAPES = ((2720, 1000), (320, 264), (14336, 256), (4096, 4096))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gs", (32, 64, 128))
@pytest.mark.parametrize("in_f,out_f", TC_SHAPES)
def test_gemv_tc_matches_reference(dtype: torch.dtype, gs: int, in_f: int, out_f: int) -> None:
    """The tensor-core GEMV against float64 for M = 1..8, with and without bias, on outputs
    poisoned with NaN first; twice per M (the stream-K scratch must be left zeroed)."""
    if not _wgmma_ok():
        pytest.skip("the tensor-core GEMV needs compute capability 9.0 and an sm_90a library")
    if in_f % gs:
        pytest.skip(f"in {in_f} is no multiple of group {gs}")
    wq, sz, w64 = _awq_layer(out_f, in_f, gs, dtype)
    bias = torch.randn(out_f, device="cuda", dtype=dtype)
    for m in range(1, 9):
        b = bias if m % 2 else None
        for rep in range(2):
            x = torch.randn(m, in_f, device="cuda", dtype=dtype)
            poison_allocator(m * out_f * 2)
            _check(awq_ops.linear_path(x, wq, sz, b, gs, out_f, "gemv_tc"), x, w64, b, dtype,
                   f"gemv_tc M={m} gs={gs} call {rep}")


def test_gemv_tc_rejects_what_it_cannot_run() -> None:
    wq, sz, _ = _awq_layer(256, 512, 128, torch.float16)
    with pytest.raises(ValueError, match="gemv_tc"):  # M <= 8 only
        awq_ops.linear_path(torch.randn(9, 512, device="cuda", dtype=torch.float16), wq, sz, None, 128, 256,
                            "gemv_tc")
    wq, sz, _ = _awq_layer(8, 128, 128, torch.float16)
    with pytest.raises(ValueError, match="gemv_tc"):  # 2 units: fewer than one CTA's 8 warps
        awq_ops.linear_path(torch.randn(1, 128, device="cuda", dtype=torch.float16), wq, sz, None, 128, 8,
                            "gemv_tc")


def _op_dispatch_and_replays(monkeypatch, m: int, in_f: int, out_f: int, path: str):
    """Outside deterministic mode the op takes `path` for m rows of an fp16 in_f x out_f layer, gives
    the forced path's values up to float-atomic order, and is right on every CUDA-graph replay (the
    stream-K scratch left zeroed) and on new x. Returns (x, wq, sz, bias, w64) for further checks."""
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "0")
    dtype = torch.float16
    wq, sz, w64 = _awq_layer(out_f, in_f, 128, dtype)
    assert awq_ops.choose_path(m, (9, 0), True, in_f * out_f) == path
    x = torch.randn(m, in_f, device="cuda", dtype=dtype)
    bias = torch.randn(out_f, device="cuda", dtype=dtype)
    eager = ops.awq_linear(x, wq, sz, bias, 128, out_f)
    _check(eager, x, w64, bias, dtype, "op")
    forced = awq_ops.linear_path(x, wq, sz, bias, 128, out_f, path)
    assert (eager.double() - forced.double()).abs().max() <= 1e-2 * forced.double().abs().max()
    g, y = captured(lambda: ops.awq_linear(x, wq, sz, bias, 128, out_f))
    for _ in range(3):
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _check(y, x, w64, bias, dtype, "replay")
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    _check(y, x, w64, bias, dtype, "replay with new x")
    return x, wq, sz, bias, w64


@pytest.mark.parametrize("m", (1, 2, 4))
def test_gemv_tc_op_dispatch_and_graph_replay(monkeypatch, m: int) -> None:
    """Where awq_ops.TC_RULES say so (a 59 M-weight layer at M = 1..4) the op runs the tensor-core
    GEMV (_op_dispatch_and_replays); deterministic mode runs another kernel, bit-stable."""
    if not _wgmma_ok():
        pytest.skip("the tensor-core GEMV needs compute capability 9.0 and an sm_90a library")
    out_f = 4096
    x, wq, sz, bias, w64 = _op_dispatch_and_replays(monkeypatch, m, 14336, out_f, "gemv_tc")
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "1")
    first = ops.awq_linear(x, wq, sz, bias, 128, out_f)
    assert torch.equal(first, ops.awq_linear(x, wq, sz, bias, 128, out_f))
    _check(first, x, w64, bias, torch.float16, "deterministic")


# --- Hopper wgmma kernel (csrc/awq_wgmma.cu; stream-K unit = 256 outputs x 64 rows x 64 inputs) ----
# (in, out): a half stage at the end of K (320, 2720: in % 64 == 32) and outputs past the last
# 256-output row tile (264, 1000); one row tile split over many CTAs (14336 x 256); many row
# tiles (4096 x 4096).
WG_SHAPES = ((320, 264), (2720, 1000), (14336, 256), (4096, 4096))
WG_M = (1, 5, 16, 17, 24, 32, 33, 63, 64, 65, 100, 128, 200)  # row tiles of 16 / 32 / 64 rows


def _wgmma_ok() -> bool:
    from kbit_vllm.backends.cuda.ops import wgmma_ok

    return wgmma_ok(torch.device("cuda"), 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gs", (32, 64, 128))
@pytest.mark.parametrize("in_f,out_f", WG_SHAPES)
def test_wgmma_matches_reference(dtype: torch.dtype, gs: int, in_f: int, out_f: int) -> None:
    """The wgmma path against float64 over M = 1..200 (full and partial row tiles of 16, 32 and 64
    rows, several row tiles), with
    and without bias, on outputs poisoned with NaN first."""
    if not _wgmma_ok():
        pytest.skip("the wgmma kernel needs compute capability 9.0 and an sm_90a library")
    if in_f % gs:
        pytest.skip(f"in {in_f} is no multiple of group {gs}")
    wq, sz, w64 = _awq_layer(out_f, in_f, gs, dtype)
    bias = torch.randn(out_f, device="cuda", dtype=dtype)
    for m in WG_M:
        x = torch.randn(m, in_f, device="cuda", dtype=dtype)
        b = bias if m % 2 else None
        poison_allocator(m * out_f * 2)
        _check(awq_ops.linear_path(x, wq, sz, b, gs, out_f, "wgmma"), x, w64, b, dtype, f"wgmma M={m} gs={gs}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gs", (32, 128))
@pytest.mark.parametrize("in_f,out_f", WG_SHAPES)
@pytest.mark.parametrize("wide", (128, 160, 192))
def test_wgmma_wide_rows_matches_reference(dtype: torch.dtype, gs: int, in_f: int, out_f: int, wide: int,
                                           monkeypatch) -> None:
    """The wgmma kernel's 128-, 160- and 192-row tiles (awq_ops.wgmma_rows), forced onto these small
    layers: one and several row tiles, a last one nearly empty (M = 129, 161, 193) or full, with and
    without bias, against float64 on outputs poisoned with NaN first; one CTA per SM."""
    if not _wgmma_ok():
        pytest.skip("the wgmma kernel needs compute capability 9.0 and an sm_90a library")
    if in_f % gs:
        pytest.skip(f"in {in_f} is no multiple of group {gs}")
    assert tuple(awq_ops.WGMMA_TALL_TILES) == (160, 192)  # every taller tile has its case here
    monkeypatch.setitem(awq_ops.WGMMA_WIDE_ROWS_ABOVE, (9, 0), 0)
    monkeypatch.setattr(awq_ops, "WGMMA_WIDE_TILE_COST", 0.5 if wide == 128 else 99.0)
    for rows in awq_ops.WGMMA_TALL_TILES:
        monkeypatch.setitem(awq_ops.WGMMA_TALL_TILES, rows, 0.5 if rows == wide else 99.0)
    wq, sz, w64 = _awq_layer(out_f, in_f, gs, dtype)
    bias = torch.randn(out_f, device="cuda", dtype=dtype)
    dev = torch.device("cuda")
    for m in (65, 100, 128, 129, 161, 193, 300):
        rows, ctas, _ = awq_ops.wgmma_config(dev, awq_ops.SUFFIX[dtype], m, in_f, out_f)
        assert rows == wide and ctas <= awq_ops.sm_count(dev)
        x = torch.randn(m, in_f, device="cuda", dtype=dtype)
        b = bias if m % 2 else None
        poison_allocator(m * out_f * 2)
        _check(awq_ops.linear_path(x, wq, sz, b, gs, out_f, "wgmma"), x, w64, b, dtype, f"wgmma M={m} gs={gs}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gs", (32, 128))
@pytest.mark.parametrize("in_f,out_f", ((2720, 1000), (4096, 4096)))
def test_wgmma_split_k_clusters(dtype: torch.dtype, gs: int, in_f: int, out_f: int) -> None:
    """The wgmma kernel's split-K launch (each row tile's stages over a cluster of CTAs whose sums
    meet in distributed shared memory): every cluster size 1..8, stages split evenly and unevenly
    (43 stages, the last a half stage, on 2720 inputs), outputs past the last row tile, one and two x
    row tiles, with and without bias, against float64 on outputs poisoned with NaN first; and the
    same bits on a second run (the cluster adds its CTAs' sums in rank order)."""
    if not _wgmma_ok():
        pytest.skip("the wgmma kernel needs compute capability 9.0 and an sm_90a library")
    if in_f % gs:
        pytest.skip(f"in {in_f} is no multiple of group {gs}")
    wq, sz, w64 = _awq_layer(out_f, in_f, gs, dtype)
    bias = torch.randn(out_f, device="cuda", dtype=dtype)
    for m in (1, 16, 33, 64, 100):
        x = torch.randn(m, in_f, device="cuda", dtype=dtype)
        b = bias if m % 2 else None
        for splits in range(1, 9):
            poison_allocator(m * out_f * 2)
            y = awq_ops.linear_path(x, wq, sz, b, gs, out_f, f"wgmma_ck{splits}")
            _check(y, x, w64, b, dtype, f"wgmma_ck{splits} M={m} gs={gs}")
            assert torch.equal(y, awq_ops.linear_path(x, wq, sz, b, gs, out_f, f"wgmma_ck{splits}")), splits


@pytest.mark.parametrize("m", (16, 64))
def test_wgmma_split_k_graph_replay(m: int) -> None:
    """The split-K launch at its own cluster size under CUDA-graph replays, with new x, and its
    refusals (a cluster of 9; more CTAs than 64-input stages)."""
    if not _wgmma_ok():
        pytest.skip("the wgmma kernel needs compute capability 9.0 and an sm_90a library")
    dtype, in_f, out_f = torch.bfloat16, 4096, 2056
    wq, sz, w64 = _awq_layer(out_f, in_f, 128, dtype)
    bias = torch.randn(out_f, device="cuda", dtype=dtype)
    x = torch.randn(m, in_f, device="cuda", dtype=dtype)
    g, y = captured(lambda: awq_ops.linear_path(x, wq, sz, bias, 128, out_f, "wgmma_ck"))
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _check(y, x, w64, bias, dtype, "wgmma_ck replay")
    with pytest.raises(ValueError, match="wgmma_ck"):
        awq_ops.linear_path(x, wq, sz, bias, 128, out_f, "wgmma_ck9")
    wq2, sz2, _ = _awq_layer(256, 128, 128, dtype)
    with pytest.raises(ValueError, match="wgmma_ck"):
        awq_ops.linear_path(x[:, :128].contiguous(), wq2, sz2, None, 128, 256, "wgmma_ck3")


@pytest.mark.parametrize("dtype", DTYPES)
def test_op_takes_wgmma_split_k(dtype: torch.dtype, monkeypatch) -> None:
    """awq_linear launches the wgmma kernel split-K over clusters where WGMMA_CK_RULES and the grid's
    fill ask (a 2048x4096 layer at M = 33..64 on the H200): its output is the forced launch's, bit
    for bit (the cluster's sums meet in a fixed order), and right; elsewhere stream-K."""
    if not _wgmma_ok() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the rule is measured on compute capability 9.0 with an sm_90a library")
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "0")
    in_f, out_f = 2048, 4096
    wq, sz, w64 = _awq_layer(out_f, in_f, 128, dtype)
    dev = torch.device("cuda")
    for m in (16, 33, 64):
        wanted = awq_ops.wgmma_ck_wanted(dev, awq_ops.SUFFIX[dtype], m, in_f, out_f)
        assert wanted == (m >= 33), m
        x = torch.randn(m, in_f, device="cuda", dtype=dtype)
        y = ops.awq_linear(x, wq, sz, None, 128, out_f)
        _check(y, x, w64, None, dtype, f"op M={m}")
        if wanted:
            assert torch.equal(y, awq_ops.linear_path(x, wq, sz, None, 128, out_f, "wgmma_ck"))


@pytest.mark.parametrize("m", (5, 24, 63))
def test_wgmma_op_dispatch_and_graph_replay(monkeypatch, m: int) -> None:
    """Where awq_ops.WGMMA_RULES say so the op runs the wgmma kernel (row tiles of 16, 32, 64 rows;
    _op_dispatch_and_replays on a 14.7 M-weight layer); deterministic mode runs the mma.sync kernel
    instead."""
    if not _wgmma_ok():
        pytest.skip("the wgmma kernel needs compute capability 9.0 and an sm_90a library")
    out_f = 3584
    x, wq, sz, bias, _ = _op_dispatch_and_replays(monkeypatch, m, 4096, out_f, "wgmma")
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "1")
    det = ops.awq_linear(x, wq, sz, bias, 128, out_f)
    assert torch.equal(det, awq_ops.linear_path(x, wq, sz, bias, 128, out_f, "mma"))
