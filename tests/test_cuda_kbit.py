"""CUDA kbit kernels against the PyTorch reference (formats/ + backends/reference.py).

Fresh random inputs every run; outputs of kernels writing into given buffers are poisoned
with NaN first. Skips cleanly without a CUDA GPU or a library built for it.

Error bound for kbit_linear: the kernels and the reference use the same dequantized weights
(the codebook value times the E4M4 scale in fp32, rounded to the activation dtype in the MMA
path); the remaining difference is fp32 accumulation order plus one rounding of the output to
fp16 (2^-11 relative) or bf16 (2^-8), in the MMA path the weight rounding to 16 bits, and in the
table GEMVs fp16 partial sums of 8 products (16 for bf16 x, scaled below 2^10) per half before
each fp32 flush. Relative to max |y| that is far under 1e-2 (fp16) and 2e-2 (bf16).
"""

from __future__ import annotations

import pytest
import torch
from cuda_helpers import assert_close_max_norm, at_odd_offset, captured, cuda_kernels_ok, poison_allocator

from kbit_vllm import ops
from kbit_vllm.backends import reference as ref
from kbit_vllm.formats import dequantize_kbit, from_tiled, normal_float_codebook, quantize_kbit, to_tiled

_OK, _WHY = cuda_kernels_ok()
pytestmark = pytest.mark.skipif(not _OK, reason=f"CUDA kbit kernels unavailable: {_WHY}")

if _OK:
    from kbit_vllm.backends.cuda import dispatch
    from kbit_vllm.backends.cuda import ops as cuda_ops
    from kbit_vllm.backends.cuda.cargs import SUFFIX

DEV = "cuda"
KS = (2, 3, 4, 5)
DTYPES = (torch.float16, torch.bfloat16)
TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
MS = (1, 2, 3, 4, 5, 8, 15, 16, 17, 32, 33, 64, 100, 256, 1000)
# (in, out): tiny layers (cluster GEMV), stream-K ranges that split tiles, cover whole tiles
# (nb = 1) and end in a padded tile.
SHAPES = ((96, 200), (160, 1000), (256, 128), (4096, 300), (32, 4100), (64, 20000))


def _sk_runs(k: int, m: int, in_f: int, out_f: int, dtype=torch.float16) -> bool:
    """Whether the forced stream-K GEMV runs this layer here (a CTA's warps of units, and for k = 5
    a GPU whose shared memory holds its 160 KB: not sm_86 / sm_89)."""
    return cuda_ops.gemv_sk_ctas(torch.device(DEV), SUFFIX[dtype], k, m, out_f, in_f // 32, forced=True) > 0


def _weights(out_f: int, in_f: int, k: int):
    w = torch.randn(out_f, in_f, device=DEV) * torch.rand(out_f, 1, device=DEV)
    cb = normal_float_codebook(k).to(DEV)
    packed, absmax = quantize_kbit(w, cb, k)
    return packed, absmax, cb


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32))
def test_quantize_bit_exact(k, dtype):
    w = (torch.randn(300, 160, device=DEV) * 3).to(dtype)
    cb = normal_float_codebook(k).to(DEV)
    p, a = ops.kbit_quantize(w, cb, k)
    p_ref, a_ref = quantize_kbit(w, cb, k)
    assert torch.equal(p, p_ref) and torch.equal(a, a_ref)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32))
def test_dequantize_bit_exact(k, dtype):
    packed, absmax, cb = _weights(200, 160, k)
    got = ops.kbit_dequantize(packed, absmax, cb, k, dtype)
    want = dequantize_kbit(packed, absmax, cb, k, dtype)
    assert torch.equal(got, want)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("out_f", (1000, 200, 128, 1))
def test_repack_unrepack_exact(k, out_f):
    packed, absmax, _ = _weights(out_f, 96, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    pt_ref, at_ref = to_tiled(packed, absmax, k)
    assert torch.equal(pt, pt_ref) and torch.equal(at, at_ref)
    p2, a2 = ops.kbit_unrepack(pt, at, k, out_f)
    assert torch.equal(p2, packed) and torch.equal(a2, absmax)
    p3, a3 = from_tiled(pt, at, k, out_f)
    assert torch.equal(p3, packed) and torch.equal(a3, absmax)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_tiled_bit_exact(k, dtype):
    packed, absmax, cb = _weights(1000, 160, k)
    pt, at = to_tiled(packed, absmax, k)
    x = torch.randn(300, 160, device=DEV, dtype=dtype)
    # The dequant path's weight equals the reference weight bit for bit, so F.linear matches.
    got = cuda_ops.linear_path(x, pt, at, cb, None, k, 1000, "dequant")
    want = torch.nn.functional.linear(x, ref.dequantize_tiled(pt, at, cb, k, 1000, dtype))
    assert torch.equal(got, want)


def _check_linear(y: torch.Tensor, x: torch.Tensor, w64: torch.Tensor, bias, dtype) -> None:
    want = x.double() @ w64.t()
    if bias is not None:
        want = want + bias.double()
    assert y.shape == want.shape and y.dtype == dtype
    assert_close_max_norm(y, want, TOL[dtype], "kbit_linear")


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_f,out_f", SHAPES)
def test_linear_all_paths(k, dtype, in_f, out_f):
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    for m in MS:
        x = torch.randn(m, in_f, device=DEV, dtype=dtype)
        sk = m <= 4 and _sk_runs(k, m, in_f, out_f, dtype)
        paths = (["gemv", "gemv_cluster"] + (["gemv_sk"] if sk else []) if m <= 4 else []) + (
            ["mma", "mma_tw1"] if m <= 256 else []) + ["dequant"] + (["wgmma"] if cuda_ops.wgmma_ok(DEV, k) else [])
        if cuda_ops.gemv_tc_ctas(torch.device(DEV), SUFFIX[dtype], k, m, out_f, in_f // 32) > 0:
            paths.append("gemv_tc")
        for path in paths:
            b = bias if m % 2 else None
            y = cuda_ops.linear_path(x, pt, at, cb, b, k, out_f, path)
            _check_linear(y, x, w64, b, dtype)
        y = ops.kbit_linear(x, pt, at, cb, bias, k, out_f)  # the op's own dispatch
        _check_linear(y, x, w64, bias, dtype)


# Forced MMA kernel variants (backends/cuda/ops.py MMA_VARIANTS) beside the default: odd N (scalar
# output stores, a padded last tile), nb odd or below a stage (the variants' generic last-stage
# load), one row tile split over CTAs and CTAs over several row tiles.
MMA_VARIANT_SHAPES = ((4000, 1001), (96, 777), (32, 4101), (1312, 2053))
MMA_VARIANT_MS = (5, 16, 17, 32, 33, 64, 100)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_f,out_f", MMA_VARIANT_SHAPES)
def test_mma_variants_match_reference(k, dtype, in_f, out_f):
    """Every MMA kernel variant and the default ("mma") against float64, with and without bias,
    on outputs poisoned with NaN first."""
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    for m in MMA_VARIANT_MS:
        x = torch.randn(m, in_f, device=DEV, dtype=dtype)
        b = bias if m % 2 else None
        for path in ("mma", *cuda_ops.MMA_VARIANTS, "wgmma", "wgmma_ck"):
            if not cuda_ops.path_ok(torch.device(DEV), path, k, m):
                continue
            poison_allocator(m * out_f * 2)
            y = cuda_ops.linear_path(x, pt, at, cb, b, k, out_f, path)
            _check_linear(y, x, w64, b, dtype)


@pytest.mark.parametrize("k", (2, 3, 4, 5))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("one_cta", (False, True))
def test_wgmma_grids(k, dtype, one_cta, monkeypatch):
    """The wgmma kernel on both grids: a full wave of two CTAs per SM and the one CTA per SM that
    dispatch.WGMMA_ONE_CTA picks for small layers (k = 5, with its 128 KB table, always runs one),
    on a layer with more (row tile, stage) units than either grid has CTAs, at row tiles of 32 and
    64 and two x row tiles, against float64 on outputs poisoned with NaN first."""
    dev = torch.device(DEV)
    if not cuda_ops.wgmma_ok(dev, k):
        pytest.skip("wgmma needs compute capability 9.0 and an sm_90a library")
    monkeypatch.setitem(dispatch.WGMMA_ONE_CTA, (9, 0), ((1 << 40, 1),) if one_cta else ())
    in_f, out_f = 4096, 2053
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    for m in (17, 32, 33, 64, 100):
        _, ctas, _ = cuda_ops.wgmma_config(dev, SUFFIX[dtype], k, m, out_f, in_f // 32)
        assert (ctas <= cuda_ops._sms(dev)) == (one_cta or k == 5)
        x = torch.randn(m, in_f, device=DEV, dtype=dtype)
        b = bias if m % 2 else None
        poison_allocator(m * out_f * 2)
        y = cuda_ops.linear_path(x, pt, at, cb, b, k, out_f, "wgmma")
        _check_linear(y, x, w64, b, dtype)


@pytest.mark.parametrize("k", (2, 3, 4, 5))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_f,out_f", ((4096, 2053), (1312, 777)))
def test_wgmma_split_k_clusters(k, dtype, in_f, out_f):
    """The wgmma kernel's split-K launch (each row tile's stages over a cluster of CTAs whose sums
    meet in distributed shared memory): every cluster size 1..8, stages split evenly and unevenly
    (21 stages on 1312 inputs), odd N (a last layout tile of 5 or 9 features), one and two x row
    tiles, with and without bias, against float64 on outputs poisoned with NaN first; and the same
    bits on a second run (the cluster adds its CTAs' sums in rank order)."""
    dev = torch.device(DEV)
    if not cuda_ops.wgmma_ok(dev, k):
        pytest.skip("wgmma needs compute capability 9.0 and an sm_90a library")
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    for m in (1, 16, 17, 33, 64, 100):
        x = torch.randn(m, in_f, device=DEV, dtype=dtype)
        b = bias if m % 2 else None
        for splits in range(1, cuda_ops.WGMMA_CK_MAX_SPLITS + 1):
            poison_allocator(m * out_f * 2)
            y = cuda_ops.linear_path(x, pt, at, cb, b, k, out_f, f"wgmma_ck{splits}")
            _check_linear(y, x, w64, b, dtype)
            again = cuda_ops.linear_path(x, pt, at, cb, b, k, out_f, f"wgmma_ck{splits}")
            assert torch.equal(y, again), f"split-K over {splits} CTAs: a second run gave other bits"


def test_wgmma_split_k_config():
    """The split-K launch's own choice fills one wave: row tiles x splits CTAs, every cluster
    resident at once, splits at most the stages; 128-row tiles are refused."""
    dev = torch.device(DEV)
    if not cuda_ops.wgmma_ok(dev, 4):
        pytest.skip("wgmma needs compute capability 9.0 and an sm_90a library")
    sfx = SUFFIX[torch.bfloat16]
    for in_f, out_f, m in ((4096, 4096, 16), (2048, 5120, 64), (14336, 4096, 16), (64, 4096, 32), (4096, 28672, 8)):
        rows, splits, row_tiles = cuda_ops.wgmma_ck_config(dev, sfx, 4, m, out_f, in_f // 32)
        assert 1 <= splits <= min(cuda_ops.WGMMA_CK_MAX_SPLITS, in_f // 64)
        assert row_tiles <= cuda_ops.wgmma_ck_clusters(dev, sfx, 4, rows, splits)
        assert row_tiles * splits <= cuda_ops._sms(dev)
    assert cuda_ops.wgmma_ck_clusters(dev, sfx, 4, 64, 2) >= cuda_ops._sms(dev) // 4
    for path in ("wgmma_ck9", "wgmma_ck2"):  # 8 CTAs at most; 64 inputs are one stage, not two
        with pytest.raises(ValueError, match="wgmma_ck"):
            cuda_ops.linear_path(torch.randn(4, 64, device=DEV, dtype=torch.bfloat16),
                                 *ops.kbit_repack(*_weights(256, 64, 4)[:2], 4), normal_float_codebook(4).to(DEV),
                                 None, 4, 256, path)
    assert not cuda_ops.wgmma_ck_wanted(dev, sfx, 5, 64, 4096, 2048 // 32)  # k = 5: not measured


@pytest.mark.parametrize("k", (2, 3, 4, 5))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_f,out_f", ((4096, 2053), (1312, 777)))
def test_wgmma_wide_rows(k, dtype, in_f, out_f, monkeypatch):
    """The wgmma kernel's 128-row tile (dispatch.wgmma_dense_rows), forced onto layers below its size
    rule: one and several x row tiles, a last one nearly empty (M = 129, 257) or full, odd N (a
    missing second layout tile), with and without bias, against float64 on outputs poisoned with
    NaN first."""
    dev = torch.device(DEV)
    if not cuda_ops.wgmma_ok(dev, k):
        pytest.skip("wgmma needs compute capability 9.0 and an sm_90a library")
    monkeypatch.setitem(dispatch.WGMMA_WIDE_ROWS_ABOVE, (9, 0), 0)
    monkeypatch.setitem(dispatch.WGMMA_WIDE_TILE_COST, k, 1.0)
    monkeypatch.setattr(dispatch, "WGMMA_TALL_TILES", {})  # the 128-row tile, not a tall one
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    for m in (65, 100, 128, 129, 257, 300):
        rows, ctas, _ = cuda_ops.wgmma_config(dev, SUFFIX[dtype], k, m, out_f, in_f // 32)
        assert rows == 128 and ctas <= cuda_ops._sms(dev)  # one CTA per SM
        x = torch.randn(m, in_f, device=DEV, dtype=dtype)
        b = bias if m % 2 else None
        poison_allocator(m * out_f * 2)
        y = cuda_ops.linear_path(x, pt, at, cb, b, k, out_f, "wgmma")
        _check_linear(y, x, w64, b, dtype)


@pytest.mark.parametrize("k", (2, 3, 4, 5))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_f,out_f", ((4096, 2053), (1312, 777)))
@pytest.mark.parametrize("tall", (160, 192, 256, 320, 384))
def test_wgmma_tall_rows(k, dtype, in_f, out_f, tall, monkeypatch):
    """The wgmma kernel's tall tiles (160, 192, 256 rows; one layout tile, one m64 tile a warpgroup;
    320 and 384 rows, two wgmmas and two x boxes a k16 step), forced onto layers below their size
    rule: one and several x row tiles, a last one nearly empty (M = 257, 513), full, or with its
    second x box wholly past M (M = 700 at 320 rows), odd N (a last layout tile of 5 or 9
    features), with and without bias, against float64 on outputs poisoned with NaN first."""
    dev = torch.device(DEV)
    if not cuda_ops.wgmma_ok(dev, k):
        pytest.skip("wgmma needs compute capability 9.0 and an sm_90a library")
    assert tuple(dispatch.WGMMA_TALL_TILES) == (160, 192, 256, 320, 384)  # every tall tile has its case here
    monkeypatch.setitem(dispatch.WGMMA_WIDE_ROWS_ABOVE, (9, 0), 0)
    for rows in dispatch.WGMMA_TALL_TILES:
        monkeypatch.setitem(dispatch.WGMMA_TALL_TILES, rows, {k: 0.5 if rows == tall else 99.0})
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    for m in (65, 161, 193, 200, 256, 257, 330, 513, 700):
        rows, ctas, _ = cuda_ops.wgmma_config(dev, SUFFIX[dtype], k, m, out_f, in_f // 32)
        assert rows == tall and ctas <= cuda_ops._sms(dev)  # one CTA per SM
        x = torch.randn(m, in_f, device=DEV, dtype=dtype)
        b = bias if m % 2 else None
        poison_allocator(m * out_f * 2)
        y = cuda_ops.linear_path(x, pt, at, cb, b, k, out_f, "wgmma")
        _check_linear(y, x, w64, b, dtype)


def test_linear_leading_dims_and_fp32():
    k, in_f, out_f = 4, 160, 200
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    for shape in ((2, 3, in_f), (1, 1, in_f), (5, 7, in_f)):
        x = torch.randn(*shape, device=DEV, dtype=torch.float16)
        y = ops.kbit_linear(x, pt, at, cb, None, k, out_f)
        assert y.shape == (*shape[:-1], out_f)
        _check_linear(y.reshape(-1, out_f), x.reshape(-1, in_f), w64, None, torch.float16)
    x = torch.randn(3, in_f, device=DEV)
    y = ops.kbit_linear(x, pt, at, cb, None, k, out_f)
    assert torch.allclose(y.double(), x.double() @ w64.t(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", ("gemv_sk", "gemv_cluster", "mma"))
@pytest.mark.parametrize("scale", (1e-30, 1e-6, 1e4, 1e30))
def test_bf16_activation_range(scale, path):
    """bf16 x far outside fp16's range: the GEMV's per-row power-of-two rescaling stays exact."""
    k, in_f, out_f = 4, 2048, 1000
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    x = (torch.randn(3, in_f, device=DEV) * scale).to(torch.bfloat16)
    x[1] *= 1e3 if scale < 1e30 else 1e-3  # rows of different magnitude in one call
    y = cuda_ops.linear_path(x, pt, at, cb, None, k, out_f, path)
    for r in range(3):
        _check_linear(y[r : r + 1], x[r : r + 1], w64, None, torch.bfloat16)


@pytest.mark.parametrize("k", (2, 3, 4, 5))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", (1, 2, 3, 4))
@pytest.mark.parametrize("in_f,out_f", ((5120, 4001), (16384, 1500), (16416, 1500), (64, 640000)))
def test_gemv_sk_staged_x(k, dtype, m, in_f, out_f):
    """M <= 4 stream-K GEMV on layers whose CTAs get >= 12 units: each warp stages the x blocks of
    its own units in shared memory as fp16 times its own power of two per row (csrc/kbit_gemv_sk.cu,
    XS; fp16 x is scaled too, so one flush per block cannot overflow; row r in the r-th even share
    of the warp's slots, each row at a magnitude of its own), with warp ranges that wrap from one
    tile into the next, nb = 512 and 513 (no limit on nb), and (64 inputs) warps with more units
    than blocks, so their slots wrap and whole tiles are written directly at the warp's scales."""
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    nb, units = in_f // 32, ((out_f + 127) // 128) * (in_f // 32)
    if not _sk_runs(k, m, in_f, out_f):
        pytest.skip(f"the k={k} stream-K GEMV's shared memory does not fit this GPU")
    sfx = "bf16" if dtype == torch.bfloat16 else "fp16"
    ctas = cuda_ops.gemv_sk_ctas(torch.device(DEV), sfx, k, m, out_f, nb, forced=True)
    warps = cuda_ops.gemv_sk_warps(k) * ctas  # k = 5: 16 a CTA, 32 staging slots each
    assert units >= 12 * ctas and -(-units // warps) <= (512 // cuda_ops.gemv_sk_warps(k) // m) & ~1, \
        "the shape no longer reaches the staged-x kernel"
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    blk = torch.arange(in_f, device=DEV) // 32 % 7
    if dtype == torch.bfloat16:
        # Per-block magnitudes 2^0..2^18 give warps different scales; a partial left at the wrong
        # scale would be off by up to 2^18 relative to its share of every output.
        cases = ((1e-30, None), (1.0, bias), (1e30, None), (torch.pow(2.0, 3.0 * blk), None))
        rows = (1.0, 1e3, 1e-3, 1e-6)  # each row's magnitude against the first's (1e33..1e-36 in range)
    else:
        # fp16 x inside its range, output too (k=2's dequantized weights reach the block absmax, so
        # y of a block at |x| ~ 2000 overflows fp16 somewhere in 640000 rows): tiny rows (scaled
        # up), blocks of 2^-6..2^6 (warps at different scales) and one block of |x| up to ~1500 (its
        # warp scales its x down).
        big = torch.ones(in_f, device=DEV)
        big[:32] = 300.0
        cases = ((1e-4, None), (1.0, bias), (torch.pow(2.0, 2.0 * blk) / 64.0, None), (big, None))
        rows = (1.0, 1.0 / 16.0, 2.0, 0.25)
    for scale, b in cases:
        x = torch.randn(m, in_f, device=DEV) * scale
        x *= torch.tensor(rows[:m], device=DEV)[:, None]
        x = x.to(dtype)
        poison_allocator(m * out_f * 2)
        y = cuda_ops.linear_path(x, pt, at, cb, b, k, out_f, "gemv_sk")
        for r in range(m):  # each row against its own magnitude
            _check_linear(y[r : r + 1], x[r : r + 1], w64, b, dtype)


@pytest.mark.parametrize("k", (2, 4))
def test_gemv_sk_m1_grid(k):
    """At M=1 (k <= 4) the op's stream-K GEMV runs two CTAs an SM on a layer where a full wave of
    three would give each warp fewer than dispatch.SK_M1_FULL_WAVE_FROM units (Llama-3-8B's qkv), and
    the full wave on one with more (22400 units: >= 6 a warp up to 155 SMs); both grids match the
    reference (bf16 x, staged per warp)."""
    dev = torch.device(DEV)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    small, big = (4096, 6144), (2048, 44800)  # (in, out): 6144 and 22400 (tile, block) units
    wave = cuda_ops.gemv_sk_ctas(dev, "bf16", k, 1, big[1], big[0] // 32)
    if wave <= 2 * sms:
        pytest.skip("the M=1 stream-K GEMV runs two CTAs an SM or fewer on this GPU: no smaller grid")
    assert wave == 3 * sms
    assert cuda_ops.gemv_sk_ctas(dev, "bf16", k, 1, small[1], small[0] // 32) == 2 * sms
    for in_f, out_f in (small, big):
        packed, absmax, cb = _weights(out_f, in_f, k)
        pt, at = ops.kbit_repack(packed, absmax, k)
        w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
        x = torch.randn(1, in_f, device=DEV).to(torch.bfloat16)
        poison_allocator(out_f * 2)
        _check_linear(ops.kbit_linear(x, pt, at, cb, None, k, out_f), x, w64, None, torch.bfloat16)
        del w64


@pytest.mark.parametrize("k", (2, 3, 4))
@pytest.mark.parametrize("in_f,out_f", ((2048, 1000), (16384, 96), (4096, 4096)))
def test_bf16_table_gemv_blocks_of_mixed_magnitude(k, in_f, out_f):
    """The table GEMV (csrc/kbit_gemv.cu) stages bf16 x as fp16 times a power of two per (row,
    32-element block): rows of scale 2^-14..2^14 times blocks stepped 2^0..2^18, M = 1..4, one
    or many staged chunks (16384 inputs), with and without a cluster split. A block left at
    another block's or row's scale shows as a wrong or overflowed row, so each row is checked."""
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    stepped = torch.pow(2.0, 3.0 * (torch.arange(in_f, device=DEV) // 32 % 7))
    for m in range(1, dispatch.GEMV_MAX_M + 1):
        rows = torch.pow(2.0, torch.randint(-14, 15, (m, 1)).float()).to(DEV)
        for blocks in (1.0, stepped):
            x = (torch.randn(m, in_f, device=DEV) * rows * blocks).to(torch.bfloat16)
            poison_allocator(m * out_f * 2)
            y = cuda_ops.linear_path(x, pt, at, cb, None, k, out_f, "gemv_cluster")
            assert torch.isfinite(y).all(), f"M={m}: non-finite outputs"
            for r in range(m):
                _check_linear(y[r : r + 1], x[r : r + 1], w64, None, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", (1, 3, 8, 40))
def test_nonfinite_activations_propagate(dtype, m):
    """An Inf or NaN in one row of x makes that row's outputs non-finite (as in fp16 matmul) and
    leaves the other rows right; no kernel faults."""
    k, in_f, out_f = 4, 2048, 1000
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    x = torch.randn(m, in_f, device=DEV, dtype=dtype)
    x[0, 7] = float("inf")
    if m > 1:
        x[m - 1, 100] = float("nan")
    y = ops.kbit_linear(x, pt, at, cb, None, k, out_f)
    torch.cuda.synchronize()
    assert not torch.isfinite(y[0]).any()
    if m > 1:
        assert torch.isnan(y[m - 1]).all()
    if m > 2:
        _check_linear(y[1 : m - 1], x[1 : m - 1], w64, None, dtype)


@pytest.mark.parametrize("m", (1, 3, 4, 8))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_f,out_f", ((4096, 1000), (128, 4880), (64, 20000)))
def test_deterministic_mode(m, dtype, in_f, out_f, monkeypatch):
    """KBIT_VLLM_DETERMINISTIC=1: cluster GEMV and split-K MMA sum in a fixed order: same bits,
    call after call, whatever memory the outputs land in (garbage allocations between calls
    would expose outputs a kernel leaves unwritten)."""
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "1")
    k = 4 if in_f == 128 else 3
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    x = torch.randn(m, in_f, device=DEV, dtype=dtype)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    first = ops.kbit_linear(x, pt, at, cb, bias, k, out_f)
    _check_linear(first, x, dequantize_kbit(packed, absmax, cb, k, torch.float64), bias, dtype)
    keep = []
    for i in range(20):
        keep.append(torch.full((m * out_f + 64 * i,), float("nan"), device=DEV, dtype=dtype))
        again = ops.kbit_linear(x, pt, at, cb, bias, k, out_f)
        assert torch.equal(again, first), f"call {i + 2}: {int((again != first).sum())} outputs differ"


@pytest.mark.parametrize("path", ("mma_tw1", "mma_tw2", "mma_v1", "mma_v2", "mma_v3", "mma_v4", "mma_v5"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_mma_deterministic_stream_k(path, dtype, monkeypatch):
    """Deterministic mode: the stream-K MMA's partial row tiles are summed in CTA order from
    per-CTA slots, so repeated calls give the same bits, for row tiles split over many CTAs
    (few tiles, long K) and for CTAs covering several row tiles (short K)."""
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "1")
    k = 4
    for in_f, out_f in ((8192, 300), (4096, 1000), (64, 20000)):
        packed, absmax, cb = _weights(out_f, in_f, k)
        pt, at = ops.kbit_repack(packed, absmax, k)
        w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
        bias = torch.randn(out_f, device=DEV, dtype=dtype)
        for m in (5, 16, 40, 64, 100):
            if not cuda_ops.path_ok(torch.device(DEV), path, k, m):
                continue
            x = torch.randn(m, in_f, device=DEV, dtype=dtype)
            first = cuda_ops.linear_path(x, pt, at, cb, bias, k, out_f, path)
            _check_linear(first, x, w64, bias, dtype)
            for _ in range(3):
                assert torch.equal(cuda_ops.linear_path(x, pt, at, cb, bias, k, out_f, path), first)


@pytest.mark.parametrize("deterministic", (True, False))
@pytest.mark.parametrize("m", (1, 4, 16, 64, 300))
@pytest.mark.parametrize("dtype", DTYPES)
def test_graph_replay_equals_eager(m, dtype, deterministic, monkeypatch):
    """Replays equal eager: bit for bit in deterministic mode; otherwise the stream-K GEMV's
    float-atomic sums may differ in the last bit, and every replay must still be right (its
    accumulators and counters are left zeroed for the next replay)."""
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "1" if deterministic else "0")
    k, in_f, out_f = 4, 8192, 8192  # split-K active for the MMA path, the stream-K GEMV chosen
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    x = torch.randn(m, in_f, device=DEV, dtype=dtype)

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        if deterministic:
            return torch.equal(a, b)
        return bool(((a.double() - b.double()).abs().max() / b.double().abs().max()) < 1e-2)

    eager = ops.kbit_linear(x, pt, at, cb, bias, k, out_f)
    g, y = captured(lambda: ops.kbit_linear(x, pt, at, cb, bias, k, out_f), warmups=2)
    for _ in range(3):
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert same(y, eager)
        _check_linear(y, x, w64, bias, dtype)
    x.copy_(torch.randn_like(x))  # the graph reads the new input
    g.replay()
    assert same(y, ops.kbit_linear(x, pt, at, cb, bias, k, out_f))


# The tensor-core GEMV (forced): a tile split over many warps (4096x300, 64 warps a tile), whole
# tiles of one block (32x4100), odd N with a padded last tile (1312x2053, scalar stores), and a grid
# of whole tiles and split ones (8192x1024).
TC_SHAPES = ((4096, 300), (32, 4100), (1312, 2053), (8192, 1024))


@pytest.mark.parametrize("k", (2, 3, 4, 5))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_f,out_f", TC_SHAPES)
def test_gemv_tc_matches_reference(k, dtype, in_f, out_f):
    """The Hopper tensor-core GEMV at every M it takes (1..8), with and without bias, twice per M
    (the first call must leave its scratch zeroed), on outputs poisoned with NaN first."""
    dev = torch.device(DEV)
    if not cuda_ops.wgmma_ok(dev, k):
        pytest.skip("tensor-core GEMV needs compute capability 9.0 and an sm_90a library")
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    for m in range(1, cuda_ops.TC_MAX_M + 1):
        assert cuda_ops.gemv_tc_ctas(dev, SUFFIX[dtype], k, m, out_f, in_f // 32) > 0
        x = torch.randn(m, in_f, device=DEV, dtype=dtype)
        b = bias if m % 2 else None
        for _ in range(2):
            poison_allocator(m * out_f * 2)
            y = cuda_ops.linear_path(x, pt, at, cb, b, k, out_f, "gemv_tc")
            _check_linear(y, x, w64, b, dtype)


def test_gemv_tc_rejects():
    """The forced tensor-core GEMV names what it takes instead of computing anything wrong."""
    dev = torch.device(DEV)
    if not cuda_ops.wgmma_ok(dev, 4):
        pytest.skip("tensor-core GEMV needs compute capability 9.0 and an sm_90a library")
    for k, m, in_f, out_f in ((5, 9, 4096, 512), (4, 9, 4096, 512), (4, 1, 32, 128)):
        packed, absmax, cb = _weights(out_f, in_f, k)
        pt, at = ops.kbit_repack(packed, absmax, k)
        x = torch.randn(m, in_f, device=DEV, dtype=torch.float16)
        with pytest.raises(ValueError, match="gemv_tc path takes k <= 5, M <= 8"):
            cuda_ops.linear_path(x, pt, at, cb, None, k, out_f, "gemv_tc")


def _forced_path_graph_replay(path: str, m: int, dtype, k: int = 4) -> None:
    """A forced path inside a CUDA graph: every replay is right and sees a new input, so its
    partial-tile accumulators and counters are left zeroed between launches."""
    in_f, out_f = 4096, 2053
    if not cuda_ops.path_ok(torch.device(DEV), path, k, m):
        pytest.skip(f"{path} needs compute capability 9.0 and an sm_90a library")
    if path == "gemv_sk" and not _sk_runs(k, m, in_f, out_f, dtype):
        pytest.skip(f"the k={k} stream-K GEMV's shared memory does not fit this GPU")
    packed, absmax, cb = _weights(out_f, in_f, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64)
    bias = torch.randn(out_f, device=DEV, dtype=dtype)
    x = torch.randn(m, in_f, device=DEV, dtype=dtype)
    g, y = captured(lambda: cuda_ops.linear_path(x, pt, at, cb, bias, k, out_f, path))
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _check_linear(y, x, w64, bias, dtype)


@pytest.mark.parametrize("m", (1, 3, 8))
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_tc_graph_replay(m, dtype):
    """The tensor-core GEMV, forced, under CUDA-graph replays (_forced_path_graph_replay)."""
    _forced_path_graph_replay("gemv_tc", m, dtype)


@pytest.mark.parametrize("m", (5, 24, 64, 100))
@pytest.mark.parametrize("dtype", DTYPES)
def test_wgmma_graph_replay(m, dtype):
    """The wgmma kernel, forced, under CUDA-graph replays (_forced_path_graph_replay)."""
    _forced_path_graph_replay("wgmma", m, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_takes_split_k_clusters(dtype):
    """kbit_linear launches the wgmma kernel split-K over clusters where dispatch.WGMMA_CK_RULES and
    the grid's fill ask (a 2048x4096 layer at M = 33..64 on the H200): its output is the forced
    launch's, bit for bit (the cluster's sums meet in a fixed order), and right; elsewhere stream-K."""
    dev = torch.device(DEV)
    if not cuda_ops.wgmma_ok(dev, 4) or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the rule is measured on compute capability 9.0 with an sm_90a library")
    in_f, out_f = 2048, 4096
    packed, absmax, cb = _weights(out_f, in_f, 4)
    pt, at = ops.kbit_repack(packed, absmax, 4)
    w64 = dequantize_kbit(packed, absmax, cb, 4, torch.float64)
    sfx = SUFFIX[dtype]
    for m in (16, 33, 64, 100):
        wanted = cuda_ops.wgmma_ck_wanted(dev, sfx, 4, m, out_f, in_f // 32)
        assert wanted == (33 <= m <= 64), m
        x = torch.randn(m, in_f, device=DEV, dtype=dtype)
        y = ops.kbit_linear(x, pt, at, cb, None, 4, out_f)
        _check_linear(y, x, w64, None, dtype)
        if wanted:
            assert torch.equal(y, cuda_ops.linear_path(x, pt, at, cb, None, 4, out_f, "wgmma_ck"))


@pytest.mark.parametrize("m", (16, 64))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", ("wgmma_ck", "wgmma_ck8"))
def test_wgmma_split_k_graph_replay(m, dtype, path):
    """The wgmma kernel's split-K launch (its own cluster size and 8), forced, under CUDA-graph
    replays (_forced_path_graph_replay)."""
    _forced_path_graph_replay(path, m, dtype)


@pytest.mark.parametrize("k", (4, 5))
@pytest.mark.parametrize("m", (1, 2, 4))
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_sk_graph_replay(m, dtype, k):
    """The stream-K GEMV, forced, under CUDA-graph replays (_forced_path_graph_replay); k = 5 runs
    its own CTA shape (16 warps, one CTA per SM beside the 128 KB pair table)."""
    _forced_path_graph_replay("gemv_sk", m, dtype, k)


@pytest.mark.parametrize("m", (1, 2, 64))
def test_linear_weights_at_unaligned_offset(m):
    """Weights that are views at a 4-byte (not 16-byte) offset give the aligned tensors' output:
    the kernels' vector loads, bulk copies and L2 prefetches never see the odd address."""
    packed, absmax, cb = _weights(512, 1024, 4)
    pt, at = ops.kbit_repack(packed, absmax, 4)
    pt_odd, at_odd = at_odd_offset(pt), at_odd_offset(at)
    x = torch.randn(m, 1024, device=DEV, dtype=torch.bfloat16)
    want = ops.kbit_linear(x, pt, at, cb, None, 4, 512)
    got = ops.kbit_linear(x, pt_odd, at_odd, cb, None, 4, 512)
    assert_close_max_norm(got, want, 1e-3, "unaligned weights")  # stream-K / MMA add partials in any order


@pytest.mark.parametrize("m", (100, 300))
@pytest.mark.parametrize("dtype", DTYPES)
def test_wgmma_wide_graph_replay(m, dtype, monkeypatch):
    """The wgmma kernel's 128-row tile (forced onto the small layer) under CUDA-graph replays."""
    monkeypatch.setitem(dispatch.WGMMA_WIDE_ROWS_ABOVE, (9, 0), 0)
    monkeypatch.setitem(dispatch.WGMMA_WIDE_TILE_COST, 4, 1.0)
    monkeypatch.setattr(dispatch, "WGMMA_TALL_TILES", {})
    _forced_path_graph_replay("wgmma", m, dtype)


@pytest.mark.parametrize("m", (200, 600))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tall", (256, 384))
def test_wgmma_tall_graph_replay(m, dtype, tall, monkeypatch):
    """The wgmma kernel's 256- and 384-row tall tiles (forced onto the small layer) under CUDA-graph
    replays."""
    monkeypatch.setitem(dispatch.WGMMA_WIDE_ROWS_ABOVE, (9, 0), 0)
    for rows in dispatch.WGMMA_TALL_TILES:
        monkeypatch.setitem(dispatch.WGMMA_TALL_TILES, rows, {4: 0.5 if rows == tall else 99.0})
    _forced_path_graph_replay("wgmma", m, dtype)
