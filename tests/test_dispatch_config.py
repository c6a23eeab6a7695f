"""Launch-configuration rules of the CUDA backend that need no GPU: they only compute numbers, and
a wrong one costs speed silently (the kernels stay correct), so the measured rules are pinned here."""

from __future__ import annotations

import pytest

from kbit_vllm.backends.cuda import dispatch
from kbit_vllm.backends.cuda.ops import GGEMV_GROUP_BLOCKS, GGEMV_MAX_WARPS, grouped_gemv_config, grouped_mma_config

H200_SMS = 132


@pytest.mark.parametrize(("rows", "n_exp", "n", "nb", "want_bm"), [
    (64 * 8, 8, 512, 64, 16),      # seed 002 gate, 64 tokens x 8 experts: bm64 gives 32 tiles
    (64 * 8, 8, 2048, 16, 32),     # seed 002 down: bm64 gives 128 tiles (< 132 SMs), bm32 256
    (256 * 8, 8, 512, 64, 32),     # seed 002 gate, 256 tokens
    (256 * 8, 8, 2048, 16, 64),    # seed 002 down, 256 tokens: 512 tiles at bm64
    (1024 * 8, 128, 768, 64, 64),  # Qwen3-MoE gate at 1024 tokens: 768 tiles at bm64
    (256 * 8, 128, 768, 64, 32),   # 16 rows per expert over 128 experts: the table's bm32
])
def test_grouped_mma_tile_halves_below_one_tile_per_sm(rows: int, n_exp: int, n: int, nb: int,
                                                       want_bm: int) -> None:
    bm, items, splits = grouped_mma_config(rows, n_exp, n, nb, H200_SMS)
    assert bm == want_bm
    per = dispatch.grouped_rows_per_expert(rows, n_exp)
    assert items >= min(n_exp, rows) * -(-per // bm)  # the grid bound covers every expert's tiles
    assert 1 <= splits <= 16


@pytest.mark.parametrize("rows,n_exp,want", [
    (8, 128, 2), (16, 128, 1), (24, 128, 1), (32, 128, 1), (33, 128, 2), (64, 128, 2), (128, 128, 2),
    (256, 128, 2), (8, 8, 2), (16, 8, 2), (32, 8, 2), (64, 8, 2), (1, 128, 2),
])
def test_grouped_sk_rows_per_pass(rows: int, n_exp: int, want: int) -> None:
    """Two rows per pass except where rows spread at most one per expert over 16..32 rows."""
    assert dispatch.grouped_sk_rows(rows, n_exp) == want


def test_grouped_mma_forced_tile_is_kept() -> None:
    assert grouped_mma_config(64 * 8, 8, 512, 64, H200_SMS, bm=64)[0] == 64


def test_kbit_mma_variant_by_rows_and_bits() -> None:
    """The "mma" path runs variant 5 (2 CTAs/SM, x in the table's spare halves) for k <= 4 up to
    dispatch.MMA_V5_MAX_M rows, which its instantiations cover; k = 5 and more rows keep v2."""
    from kbit_vllm.backends.cuda.ops import mma_variant_ok

    assert dispatch.MMA_V5_MAX_M > 0
    assert dispatch.mma_variant(8, 4) == 5 and dispatch.mma_variant(dispatch.MMA_V5_MAX_M, 2) == 5
    assert mma_variant_ok(5, 4, dispatch.MMA_V5_MAX_M)
    assert dispatch.mma_variant(8, 5) == dispatch.MMA_VARIANT
    assert dispatch.mma_variant(dispatch.MMA_V5_MAX_M + 1, 4) == dispatch.MMA_VARIANT
    assert not mma_variant_ok(5, 5, 8)


def test_kbit_gemv_rows_by_bits() -> None:
    """H200: M = 4 runs the MMA (variant 5) for k <= 4, while k = 5 (no variant 5) keeps the GEMV."""
    assert dispatch.choose_path(3, (9, 0), 4096 * 4096, 4) == "gemv"
    assert dispatch.choose_path(4, (9, 0), 4096 * 4096, 4) == "mma"
    assert dispatch.choose_path(4, (9, 0), 4096 * 4096, 5) == "gemv"
    assert dispatch.choose_path(5, (9, 0), 4096 * 4096, 5) == "mma"


def test_kbit_tensor_core_gemv_rows() -> None:
    """H200: the tensor-core GEMV takes M = 3..8 on the largest layers, fewer rows on smaller ones (k=4:
    M = 3..6 on layers of 40-100 M weights, M=3 above 18 M; k = 2, 3: M = 3..8 above 100 M, 3..7 above
    40 M, M=3 above 18 M; the wgmma kernel takes the rows after them), never M = 1 or 2 (the stream-K
    GEMV, x staged per warp, where a layer has enough units; else the cluster GEMV), nor k=4's M=3 on
    layers of 100-165 M weights (the stream-K GEMV stages x there), or where the Hopper kernels cannot
    run (wgmma=False); k = 5 has its own rows and none of them (test_kbit5_hopper_rules)."""
    big, down, mid, small, tiny = 4096 * 28672, 14336 * 4096, 4096 * 6144, 2048 * 5120, 2048 * 512
    wide = 4096 * 7168
    assert [dispatch.choose_path(m, (9, 0), big, 4, wgmma=True) for m in (1, 2, 3, 4, 8, 9)] == [
        "gemv", "gemv", "gemv", "gemv_tc", "gemv_tc", "wgmma"]
    assert [dispatch.choose_path(m, (9, 0), big, 2, wgmma=True) for m in (2, 3)] == ["gemv", "gemv_tc"]
    assert [dispatch.choose_path(m, (9, 0), 8192 * 28672, 4, wgmma=True) for m in (2, 3)] == ["gemv", "gemv_tc"]
    assert [dispatch.choose_path(m, (9, 0), down, 4, wgmma=True) for m in (2, 3, 4, 5, 6, 7)] == [
        "gemv", "gemv_tc", "gemv_tc", "gemv_tc", "gemv_tc", "wgmma"]
    assert [dispatch.choose_path(m, (9, 0), down, 2, wgmma=True) for m in (2, 3, 7, 8)] == [
        "gemv", "gemv_tc", "gemv_tc", "wgmma"]
    assert [dispatch.choose_path(m, (9, 0), 8192 * 8192, 3, wgmma=True) for m in (7, 8)] == ["gemv_tc", "wgmma"]
    assert [dispatch.choose_path(m, (9, 0), wide, 4, wgmma=True) for m in (1, 2, 3, 4)] == [
        "gemv", "gemv", "gemv_tc", "wgmma"]
    assert [dispatch.choose_path(m, (9, 0), wide, 2, wgmma=True) for m in (2, 3, 4)] == ["gemv", "gemv_tc", "wgmma"]
    assert [dispatch.choose_path(m, (9, 0), 4096 * 8192, 2, wgmma=True) for m in (3, 4)] == ["gemv_tc", "wgmma"]
    assert dispatch.choose_path(4, (9, 0), mid, 4, wgmma=True) == "wgmma"
    assert [dispatch.choose_path(m, (9, 0), mid, 3, wgmma=True) for m in (2, 3, 4, 5, 9)] == [
        "gemv", "gemv_tc", "wgmma", "wgmma", "wgmma"]
    assert dispatch.choose_path(3, (9, 0), 4096 * 5120, 4, wgmma=True) == "gemv_tc"
    assert dispatch.choose_path(4, (9, 0), 4096 * 5120, 4, wgmma=True) == "wgmma"
    assert dispatch.choose_path(3, (9, 0), 4096 * 5632, 4, wgmma=True) == "gemv_tc"
    assert dispatch.choose_path(3, (9, 0), mid, 4, wgmma=True) == "gemv_tc"
    assert dispatch.choose_path(3, (9, 0), 4096 * 4096, 4, wgmma=True) == "gemv"
    assert [dispatch.choose_path(m, (9, 0), small, 2, wgmma=True) for m in (2, 3)] == ["gemv", "gemv"]
    assert dispatch.choose_path(2, (9, 0), tiny, 4, wgmma=True) == "gemv"
    assert dispatch.choose_path(2, (9, 0), big, 5, wgmma=True) == "gemv"  # k = 5: the stream-K GEMV
    assert dispatch.choose_path(2, (9, 0), big, 4, wgmma=False) == "gemv"
    assert dispatch.choose_path(2, (8, 0), big, 4, wgmma=True) == "gemv"
    assert dispatch.rule_takes(((10, 2, 4),), 11, 3) and not dispatch.rule_takes(((10, 2, 4),), 10, 3)


def test_kbit_wgmma_rows() -> None:
    """H200: the wgmma kernel takes WGMMA_RULES' rows on layers above MMA_SMALL_LAYER (M = 9..960
    above 100 M weights, 7..960 above 40 M, 4..384 above 20 M, 4..192 below; the tensor-core GEMV's or
    the GEMV's rows before them) and WGMMA_SMALL_ROWS (M = 4..64, 4..32 up to 2 M weights) on smaller
    ones, where it can run (ops.wgmma_ok, not deterministic mode); elsewhere the MMA / dequantize +
    cuBLAS rules stand."""
    big, down, qkv, o = 4096 * 28672, 14336 * 4096, 4096 * 6144, 4096 * 4096
    small, tiny = 2048 * 2048, 2048 * 512
    for w, first, last in ((big, 9, 960), (down, 7, 960), (qkv, 4, 384), (o, 4, 192)):
        assert dispatch.choose_path(first, (9, 0), w, 4, wgmma=True) == "wgmma"
        assert dispatch.choose_path(last, (9, 0), w, 2, wgmma=True) == "wgmma"
        assert dispatch.choose_path(first - 1, (9, 0), w, 4, wgmma=True) in ("gemv", "gemv_tc")
        assert dispatch.choose_path(last + 1, (9, 0), w, 4, wgmma=True) == "dequant"
        assert dispatch.choose_path(17, (9, 0), w, 4, wgmma=False) == "mma"
        assert dispatch.choose_path(last, (9, 0), w, 4, wgmma=False) == "dequant"
    assert dispatch.choose_path(512, (9, 0), None, 4, wgmma=True) == "wgmma"  # no size: a large layer
    assert [dispatch.choose_path(m, (9, 0), small, 4, wgmma=True) for m in (3, 4, 16, 64, 65)] == [
        "gemv", "wgmma", "wgmma", "wgmma", "dequant"]
    assert [dispatch.choose_path(m, (9, 0), tiny, 2, wgmma=True) for m in (4, 32, 33)] == ["wgmma", "wgmma", "dequant"]
    assert dispatch.choose_path(17, (9, 0), small, 4, wgmma=False) == "mma"
    assert dispatch.choose_path(17, (8, 0), big, 4, wgmma=True) != "wgmma"
    assert dispatch.choose_path(17, (8, 0), small, 4, wgmma=True) != "wgmma"


def test_kbit_wgmma_dense_rows() -> None:
    """H200: the dense wgmma kernel's row tile is the smallest that holds M up to 64 rows; past it,
    on layers above 20 M weights, the tile (64, 128 or a tall one of 160, 192, 256, 320 or 384 rows)
    whose ceil(M / rows) tiles cost least (WGMMA_WIDE_TILE_COST, WGMMA_TALL_TILES): 128 rows at M =
    65..128, 160 at 129..160, 192 at 161..192, 256 at 193..256 and 385..512, 320 at 257..320 and
    513..640 and 769..960, 384 at 321..384 and 641..768 (k = 5 alike); layers
    of 12-20 M weights (4096x4096) take the tall tiles but not the 128-row one; smaller layers and
    other GPUs keep 64."""
    big, o, small = 4096 * 28672, 4096 * 4096, 2048 * 5120
    ms = (1, 17, 64, 65, 128, 129, 160, 161, 192, 193, 256, 257, 320, 321, 384, 385, 512, 513, 576, 577,
          640, 641, 768, 769, 960)
    got = {m: dispatch.wgmma_dense_rows(m, (9, 0), big, 4) for m in ms}
    assert got == {1: 16, 17: 32, 64: 64, 65: 128, 128: 128, 129: 160, 160: 160, 161: 192, 192: 192, 193: 256,
                   256: 256, 257: 320, 320: 320, 321: 384, 384: 384, 385: 256, 512: 256, 513: 320, 576: 320,
                   577: 320, 640: 320, 641: 384, 768: 384, 769: 320, 960: 320}
    assert [dispatch.wgmma_dense_rows(m, (9, 0), big, 5) for m in (65, 129, 161, 257, 321, 513, 577, 641)] == [
        128, 160, 192, 320, 384, 320, 320, 384]
    assert [dispatch.wgmma_dense_rows(m, (9, 0), o, 4) for m in (64, 65, 129, 192, 256)] == [64, 160, 160, 192, 256]
    assert [dispatch.wgmma_dense_rows(m, (9, 0), small, k) for m in (65, 192) for k in (4, 5)] == [64] * 4
    assert dispatch.wgmma_dense_rows(128, (8, 0), big, 4) == 64
    assert [dispatch.wgmma_tile_cols(r) for r in (64, 128, 160, 192, 256, 320, 384)] == [256, 256] + [128] * 5
    assert dispatch.wgmma_wide_rows(300, 1.6) == 128  # no tall tile given: the grouped kernels' choice
    assert dispatch.wgmma_wide_rows(300, None, ((192, 2.2),)) == 192


def test_kbit5_hopper_rules() -> None:
    """H200, k = 5 (no MMA variant 5): the GEMV (the stream-K table GEMV, by ops.SK_MIN_UNITS_K5) at
    M = 1..3 above 100 M weights, M = 1 elsewhere (the wgmma kernel's rules start past it), then the
    wgmma kernel up to 768 rows above 40 M weights, 256 above 20 M, 192 above MMA_SMALL_LAYER and
    64 on small layers; dequantize + cuBLAS past them, the GEMV / MMA where the Hopper kernels
    cannot run; the tensor-core GEMV takes no rows."""
    big, down, qkv, o, small = 4096 * 28672, 14336 * 4096, 4096 * 6144, 4096 * 4096, 2048 * 5120
    assert [dispatch.choose_path(m, (9, 0), big, 5, wgmma=True) for m in (1, 3, 4, 64, 768, 769)] == [
        "gemv", "gemv", "wgmma", "wgmma", "wgmma", "dequant"]
    assert [dispatch.choose_path(m, (9, 0), down, 5, wgmma=True) for m in (1, 2, 3, 768, 769)] == [
        "gemv", "gemv", "wgmma", "wgmma", "dequant"]
    assert [dispatch.choose_path(m, (9, 0), qkv, 5, wgmma=True) for m in (1, 2, 3, 256, 257)] == [
        "gemv", "gemv", "wgmma", "wgmma", "dequant"]
    assert [dispatch.choose_path(m, (9, 0), o, 5, wgmma=True) for m in (1, 2, 192, 193)] == [
        "gemv", "wgmma", "wgmma", "dequant"]
    assert [dispatch.choose_path(m, (9, 0), small, 5, wgmma=True) for m in (1, 2, 64, 65)] == [
        "gemv", "wgmma", "wgmma", "dequant"]
    assert dispatch.choose_path(8, (9, 0), None, 5, wgmma=True) == "wgmma"
    assert [dispatch.choose_path(m, (9, 0), big, 5, wgmma=False) for m in (1, 4, 5, 64, 65)] == [
        "gemv", "gemv", "mma", "mma", "dequant"]
    assert dispatch.choose_path(8, (8, 0), big, 5, wgmma=True) == "mma"


def test_stream_k_grid() -> None:
    """A stream-K GEMV grid is one wave where every warp gets min_units_per_warp units, else 0; with
    a minimum of 0 (k = 5 at M=1) or forced, any grid of >= 1 unit per warp (smaller than a wave on
    small layers), 0 where not even one CTA's warps get one."""
    assert dispatch.stream_k_grid(132, 132 * 8 * 3, 8, 3.0) == 132
    assert dispatch.stream_k_grid(132, 132 * 8 * 3 - 1, 8, 3.0) == 0
    assert dispatch.stream_k_grid(132, 10**6, 8, None) == 0
    assert dispatch.stream_k_grid(132, 256, 16, 0.0) == 16
    assert dispatch.stream_k_grid(132, 10**6, 16, 0.0) == 132
    assert dispatch.stream_k_grid(132, 15, 16, 0.0) == 0
    assert dispatch.stream_k_grid(132, 256, 16, 3.0, forced=True) == 16


def test_gemv_rows_slice() -> None:
    """The row-slice GEMV's slice: 32 rows, 64 where 32 would take more than one wave of the CTAs an
    SM the library reports, halved while the grid fills under 0.7 of the SMs; none past one wave or
    past 16384 inputs."""
    three = dict.fromkeys(dispatch.ROWS_SLICES, 3)  # D = 1: three CTAs an SM
    want = {512: 8, 2048: 16, 3072: 32, 4096: 32, 6144: 32, 8192: 32, 12672: 32, 12704: 64, 16384: 64,
            25344: 64, 25408: 0, 28672: 0}
    for out_f, rows in want.items():
        assert dispatch.gemv_rows_slice(out_f, 64, H200_SMS, three) == rows, out_f
    assert dispatch.gemv_rows_slice(4096, dispatch.ROWS_MAX_BLOCKS, H200_SMS, three) == 32
    assert dispatch.gemv_rows_slice(4096, dispatch.ROWS_MAX_BLOCKS + 1, H200_SMS, three) == 0
    assert dispatch.gemv_rows_slice(100, 4, H200_SMS, three) == 8
    # D = 4 (two CTAs an SM): one wave of 32-row slices ends at 264 CTAs, of 64-row ones at 264 too.
    two = dict.fromkeys(dispatch.ROWS_SLICES, 2)
    want2 = {8448: 32, 8480: 64, 12704: 64, 16896: 64, 16928: 0}
    for out_f, rows in want2.items():
        assert dispatch.gemv_rows_slice(out_f, 128, H200_SMS, two) == rows, out_f
    # A slice the library does not run (0 or missing) is never taken, nor halved into.
    assert dispatch.gemv_rows_slice(4096, 64, H200_SMS, {32: 0, 64: 3}) == 64
    assert dispatch.gemv_rows_slice(4096, 64, H200_SMS, {}) == 0
    assert dispatch.gemv_rows_slice(2048, 64, H200_SMS, {32: 3}) == 32  # 16 would fill less, but is not offered


def test_use_gemv_rows() -> None:
    """M=1 layers that take the row-slice GEMV on an H200 (sessions 41, 42): k=2 up to 16 M weights, or
    32 M with at most 4096 inputs; k = 3, 4 up to 16 M with at most 8192 inputs (four blocks a lane
    group in flight from 3072). Nowhere else, and on no other compute capability (not measured)."""
    h200 = (9, 0)
    yes = [(2, 8192, 2048), (2, 4096, 4096), (2, 4096, 6144), (2, 2048, 16384), (3, 3072, 5120), (3, 2048, 8192),
           (3, 4096, 4096), (3, 8192, 1024), (4, 2048, 512), (4, 2048, 8192), (4, 4096, 4096), (4, 3072, 5120),
           (4, 8192, 2048), (4, 5120, 2048)]
    no = [(2, 8192, 3072), (2, 14336, 4096), (3, 4096, 6144), (3, 2048, 16384), (3, 12288, 1024), (4, 4096, 6144),
          (4, 14336, 4096), (4, 2048, 16384), (4, 16384, 1024), (5, 2048, 2048)]
    assert all(dispatch.use_gemv_rows(k, i, o, h200) for k, i, o in yes)
    assert not any(dispatch.use_gemv_rows(k, i, o, h200) for k, i, o in no)
    assert not dispatch.use_gemv_rows(4, 2048, 2048, (8, 9))


def test_stream_k_m1_ctas() -> None:
    """At M=1 the kbit stream-K GEMV runs two CTAs an SM where a wave of three gives each warp fewer
    than SK_M1_FULL_WAVE_FROM units (Llama-3-8B's qkv and down, not gate/up); a grid of two an SM or
    fewer, and 0 (the cluster GEMV), stay as they are."""
    sms, warps = 132, 8
    wave = 3 * sms
    units = {"qkv": 48 * 128, "down": 32 * 448, "gate_up": 224 * 128, "4096x20480": 160 * 128}
    assert dispatch.stream_k_m1_ctas(wave, sms, units["qkv"], warps) == 2 * sms
    assert dispatch.stream_k_m1_ctas(wave, sms, units["down"], warps) == 2 * sms
    assert dispatch.stream_k_m1_ctas(wave, sms, units["gate_up"], warps) == wave
    assert dispatch.stream_k_m1_ctas(wave, sms, units["4096x20480"], warps) == wave
    bound = int(wave * warps * dispatch.SK_M1_FULL_WAVE_FROM)
    assert dispatch.stream_k_m1_ctas(wave, sms, bound - 1, warps) == 2 * sms
    assert dispatch.stream_k_m1_ctas(wave, sms, bound, warps) == wave
    assert dispatch.stream_k_m1_ctas(2 * sms, sms, units["qkv"], warps) == 2 * sms
    assert dispatch.stream_k_m1_ctas(300, sms, 300 * warps, warps) == 2 * sms  # forced, small layer
    assert dispatch.stream_k_m1_ctas(100, sms, 1000, warps) == 100
    assert dispatch.stream_k_m1_ctas(0, sms, units["qkv"], warps) == 0


def test_awq_wgmma_rules() -> None:
    """H200: awq_orin's wgmma kernel takes each size class's row range (WGMMA_RULES: the first
    entry the layer is above) where it can run; elsewhere DISPATCH stands."""
    from kbit_vllm.backends.cuda import awq_ops

    def tc(m: int, w: int) -> bool:  # the tensor-core GEMV's rules come first
        return dispatch.rule_takes(awq_ops.TC_RULES[(9, 0)], w, m)

    rules = awq_ops.WGMMA_RULES[(9, 0)]
    for above, first, last in rules:
        w = above + 1
        for m in (first, last):
            assert awq_ops.choose_path(m, (9, 0), True, w) == ("gemv_tc" if tc(m, w) else "wgmma")
        assert awq_ops.choose_path(first - 1, (9, 0), True, w) in (
            ("gemv_tc",) if tc(first - 1, w) else ("gemv", "mma"))
        assert awq_ops.choose_path(last + 1, (9, 0), True, w) in ("mma", "dequant")
        assert awq_ops.choose_path(first, (9, 0), False, w) != "wgmma"
        assert awq_ops.choose_path(first, (8, 0), True, w) != "wgmma"
    smallest = min(r[0] for r in rules)
    assert all(awq_ops.choose_path(m, (9, 0), True, smallest) != "wgmma" for m in range(1, 1025))
    assert all(awq_ops.choose_path(1, (9, 0), True, w) == "gemv" for w in (1 << 20, 4096 * 6144, 8192 * 4096))
    assert awq_ops.choose_path(1, (9, 0), True, 8192 * 8192) == "gemv_tc"   # M=1 from 40 M weights
    assert awq_ops.choose_path(1, (9, 0), True, 4096 * 28672) == "gemv_tc"   # Llama-3-8B gate/up, batch 1
    assert awq_ops.choose_path(1, (9, 0), False, 4096 * 28672) == "gemv"
    assert awq_ops.choose_path(4, (9, 0), True, 4096 * 28672) == "gemv_tc"   # Llama-3-8B gate/up, batch 4
    assert [awq_ops.choose_path(m, (9, 0), True, 4096 * 6144) for m in (2, 3, 4)] == ["gemv_tc", "wgmma", "wgmma"]
    assert [awq_ops.choose_path(m, (9, 0), True, 4096 * 4096) for m in (2, 3, 4)] == ["gemv", "wgmma", "wgmma"]
    assert [awq_ops.choose_path(m, (9, 0), True, 14336 * 4096) for m in (1, 4, 5)] == ["gemv_tc", "gemv_tc", "wgmma"]
    assert awq_ops.choose_path(4, (9, 0), False, 4096 * 28672) == "gemv"
    assert awq_ops.choose_path(64, (9, 0), True, 4096 * 28672) == "wgmma"
    assert awq_ops.choose_path(16, (9, 0), True, 4096 * 4096) == "wgmma"   # o_proj at batch 16
    assert awq_ops.choose_path(16, (9, 0), False, 4096 * 4096) == "mma"


def test_wgmma_tile_rows() -> None:
    """Both wgmma kernels run the smallest built row tile (wgmma N) that holds M, 64 past it (more
    row tiles), so a decode batch of 16 does not run n64 wgmmas over 48 rows of zeros."""
    from kbit_vllm.backends.cuda import ops

    assert ops.WGMMA_ROW_TILES == (16, 32, 64)
    expect = {1: 16, 2: 16, 16: 16, 17: 32, 32: 32, 33: 64, 64: 64, 65: 64, 1000: 64}
    assert {m: ops.wgmma_tile_rows(m) for m in expect} == expect


def test_wgmma_even_grid() -> None:
    """A one-wave wgmma grid shrinks (by at most 1/16) only to a count that gives every CTA the same
    whole share of one row tile."""
    from kbit_vllm.backends.cuda import dispatch

    assert dispatch.wgmma_even_grid(16 * 64, 64, 132) == 128     # 4096x4096: 8 stages a CTA
    assert dispatch.wgmma_even_grid(16 * 224, 224, 132) == 128   # 14336x4096: 28 stages a CTA
    assert dispatch.wgmma_even_grid(24 * 64, 64, 132) == 132     # 4096x6144: no even count near 132
    assert dispatch.wgmma_even_grid(112 * 64, 64, 132) == 132    # 112 whole tiles is too far below
    assert dispatch.wgmma_even_grid(40, 64, 40) == 40            # units <= SMs: left as is
    assert dispatch.wgmma_even_grid(16 * 224, 224, 264) == 256   # two CTAs per SM: 14 stages a CTA
    assert dispatch.wgmma_even_grid(112 * 64, 64, 264) == 264    # 4096x28672: none
    for units, stages, ctas in ((1024, 64, 132), (3584, 224, 132), (1536, 64, 132), (7, 7, 7), (130, 10, 66)):
        c = dispatch.wgmma_even_grid(units, stages, ctas)
        assert ctas - ctas // 16 <= c <= ctas
        assert c == ctas or (units % c == 0 and stages % (units // c) == 0)


def test_awq_wgmma_rows() -> None:
    """H200: awq_orin's dense wgmma row tile, past 64 rows on layers above 20 M weights, is the one
    whose ceil(M / rows) tiles cost least (WGMMA_WIDE_TILE_COST, WGMMA_TALL_TILES): 128 at M =
    65..128 and 193..256, 160 at 129..160, 257..320 and 385..480, 192 at 161..192, 321..384 and
    481..768; smaller layers and other GPUs keep 16 / 32 / 64."""
    from kbit_vllm.backends.cuda import awq_ops

    big, o = 4096 * 28672, 4096 * 4096
    ms = (17, 64, 65, 128, 129, 160, 161, 192, 193, 256, 257, 320, 321, 384, 385, 480, 481, 768)
    assert [awq_ops.wgmma_rows(m, (9, 0), big) for m in ms] == [
        32, 64, 128, 128, 160, 160, 192, 192, 128, 128, 160, 160, 192, 192, 160, 160, 192, 192]
    assert [awq_ops.wgmma_rows(m, (9, 0), o) for m in (65, 192)] == [64, 64]
    assert awq_ops.wgmma_rows(192, (8, 0), big) == 64


def test_awq_wgmma_one_cta_rule() -> None:
    """H200: the awq wgmma kernel runs one CTA per SM on o_proj-sized layers from M=16 and on
    qkv-sized ones from M=33; the large layers keep two per SM, and other GPUs have no rule."""
    from kbit_vllm.backends.cuda import awq_ops

    o, qkv, gate_up, down = 4096 * 4096, 4096 * 6144, 4096 * 28672, 14336 * 4096
    rules = awq_ops.WGMMA_ONE_CTA
    one = {(w, m): dispatch.wgmma_one_cta((9, 0), w, m, rules)
           for w in (o, qkv, gate_up, down) for m in (15, 16, 32, 33, 64)}
    assert {key for key, v in one.items() if v} == {(o, 16), (o, 32), (o, 33), (o, 64), (qkv, 33), (qkv, 64)}
    assert not dispatch.wgmma_one_cta((8, 9), o, 64, rules)


def test_wgmma_one_cta_rule() -> None:
    """H200: the kbit wgmma kernel runs one CTA per SM on o_proj-sized layers from M=17 and on
    qkv-sized ones from M=33 (fewer partial tiles); the large layers keep two per SM, and other
    GPUs have no rule."""
    from kbit_vllm.backends.cuda import dispatch

    o, qkv, gate_up, down = 4096 * 4096, 4096 * 6144, 4096 * 28672, 14336 * 4096
    one = {(w, m): dispatch.wgmma_one_cta((9, 0), w, m) for w in (o, qkv, gate_up, down) for m in (16, 17, 32, 33, 64)}
    assert {key for key, v in one.items() if v} == {(o, 17), (o, 32), (o, 33), (o, 64), (qkv, 33), (qkv, 64)}
    assert not dispatch.wgmma_one_cta((8, 9), o, 64)


def test_wgmma_split_k_cluster_rule() -> None:
    """H200: the kbit wgmma launch splits K over clusters on layers of at most 26 M weights at M =
    33..64 (the 64-row tiles, where stream-K's L2 reduction costs most); nowhere on the large
    layers, at fewer or more rows, or on other GPUs."""
    from kbit_vllm.backends.cuda import dispatch

    small, qkv, tp2_o, down, gate_up = 2048 * 5120, 4096 * 6144, 2048 * 4096, 14336 * 4096, 4096 * 28672
    ck = {(w, m) for w in (small, qkv, tp2_o, down, gate_up) for m in (16, 32, 33, 48, 64, 65, 128)
          if dispatch.wgmma_ck_rule((9, 0), w, m)}
    assert ck == {(w, m) for w in (small, qkv, tp2_o) for m in (33, 48, 64)}
    assert not dispatch.wgmma_ck_rule((8, 9), small, 64)
    assert 0 < dispatch.WGMMA_CK_MIN_FILL <= 1


def test_awq_wgmma_small_layers_to_64_rows() -> None:
    """H200: awq_orin's small layers (above 4 M weights) take the wgmma kernel up to M=64, split-K
    over clusters from M=33 (WGMMA_CK_RULES, as kbit's); layers of at most 4 M weights keep M <= 32
    on it and take dequantize + cuBLAS past that (DEQUANT_FROM), in deterministic mode too."""
    from kbit_vllm.backends.cuda import awq_ops, dispatch

    for w in (2048 * 5120, 2048 * 4096, 4096 * 3072):
        assert [awq_ops.choose_path(m, (9, 0), True, w) for m in (5, 33, 64, 65)] == ["wgmma"] * 3 + ["dequant"]
        assert [dispatch.wgmma_ck_rule((9, 0), w, m, awq_ops.WGMMA_CK_RULES) for m in (32, 33, 64, 65)] == [
            False, True, True, False]
    for w in (2048 * 512, 2048 * 2048, 1024 * 4096):  # at most 4 M weights: dequantize + cuBLAS past 32 rows
        assert [awq_ops.choose_path(m, (9, 0), True, w) for m in (32, 33, 64)] == ["wgmma", "dequant", "dequant"]
        assert [awq_ops.choose_path(m, (9, 0), False, w) for m in (32, 33)] == ["mma", "dequant"]
    assert awq_ops.choose_path(33, (8, 0), True, 2048 * 512) == "mma"
    assert awq_ops.choose_path(33, (9, 0), True) == "mma"  # weights unknown
    assert not dispatch.wgmma_ck_rule((9, 0), 14336 * 4096, 64, awq_ops.WGMMA_CK_RULES)
    assert not dispatch.wgmma_ck_rule((8, 9), 2048 * 5120, 64, awq_ops.WGMMA_CK_RULES)


def test_wgmma_split_k_sizes() -> None:
    """The split-K launch's cluster size: the most CTAs in one wave with every cluster resident at
    once, the smaller size on a tie, at most the stages and 8; none where nothing fits one wave;
    forced path names parse, others raise."""
    from kbit_vllm.backends.cuda import dispatch

    h200 = {1: 132, 2: 66, 3: 39, 4: 30, 5: 22, 6: 17, 7: 15, 8: 15}  # measured clusters resident at once
    assert dispatch.wgmma_ck_splits(20, 32, h200.get) == 5      # 2048x5120 at 64 rows: 100 CTAs
    assert dispatch.wgmma_ck_splits(16, 64, h200.get) == 6      # 4096x4096: 96 (7 and 8: 15 clusters)
    assert dispatch.wgmma_ck_splits(12, 64, h200.get) == 8      # 4096x3072
    assert dispatch.wgmma_ck_splits(24, 64, h200.get) == 4      # 4096x6144
    assert dispatch.wgmma_ck_splits(16, 2, h200.get) == 2       # 128 inputs: two stages
    assert dispatch.wgmma_ck_splits(112, 64, h200.get) == 1     # 4096x28672: one CTA a row tile
    assert dispatch.wgmma_ck_splits(200, 64, h200.get) is None  # more row tiles than SMs
    assert [dispatch.wgmma_ck_path_splits(p, "op") for p in ("wgmma_ck", "wgmma_ck1", "wgmma_ck8")] == [None, 1, 8]
    for bad in ("wgmma_ck0", "wgmma_ck9", "wgmma_ckx", "wgmma"):
        with pytest.raises(ValueError, match="op"):
            dispatch.wgmma_ck_path_splits(bad, "op")
    assert [dispatch.wgmma_ck_fills(c, 132) for c in ((64, 5, 20), (64, 6, 16), (64, 8, 8), None)] == [
        True, True, False, False]  # 100 and 96 CTAs of 132; 64; no config
    assert dispatch.wgmma_ck_launch((64, 4, 20), 32, "op", "wgmma_ck4", "M=64", 64) == (64, 4, 20)
    for cfg in (None, (64, 4, 20)):  # no config; more splits than the 2 stages
        with pytest.raises(ValueError, match=r"op 'wgmma_ck4' path .*\(2 here\)"):
            dispatch.wgmma_ck_launch(cfg, 2, "op", "wgmma_ck4", "M=64", 64)


def test_wgmma_ck_clusters_asked_once() -> None:
    """Both formats' cluster counts are asked of the library once per (device, kernel, size) and kept;
    the kbit and awq_orin kernels of the same rows are kept apart."""
    import torch

    from kbit_vllm.backends.cuda import ops

    asked: list[str] = []

    def query(name: str, n: int):
        return lambda: asked.append(name) or n

    dev = torch.device("cuda", 7)  # an index no other test uses: nothing cached for it yet
    try:
        assert ops.ck_clusters_cached(dev, ("kbit", 4, "bf16", 64), 8, query("kbit", 15)) == 15
        assert ops.ck_clusters_cached(dev, ("kbit", 4, "bf16", 64), 8, query("kbit", 99)) == 15
        assert ops.ck_clusters_cached(dev, ("awq", "bf16", 64), 8, query("awq", 14)) == 14
        assert asked == ["kbit", "awq"]
    finally:
        for key in [k for k in ops._CK_CLUSTERS if k[0] == 7]:
            del ops._CK_CLUSTERS[key]


def test_awq_tensor_core_gemv_rules() -> None:
    """H200: the tensor-core GEMV takes M = 1..8 on layers above 70 M weights, M = 1..4 above 40 M,
    M = 2 above 20 M, none above 12 M and M = 4 above 4 M, before the wgmma rules; nowhere without
    the Hopper kernels or on tiny layers."""
    from kbit_vllm.backends.cuda import awq_ops

    gate_up, down, qkv, small, kv = 4096 * 28672, 14336 * 4096, 4096 * 6144, 2048 * 5120, 2048 * 512
    assert [awq_ops.choose_path(m, (9, 0), True, gate_up) for m in (1, 2, 8, 9)] == [
        "gemv_tc", "gemv_tc", "gemv_tc", "wgmma"]
    assert [awq_ops.choose_path(m, (9, 0), True, down) for m in (1, 2, 4, 5)] == [
        "gemv_tc", "gemv_tc", "gemv_tc", "wgmma"]
    assert [awq_ops.choose_path(m, (9, 0), True, qkv) for m in (1, 2, 3, 4)] == ["gemv", "gemv_tc", "wgmma", "wgmma"]
    assert [awq_ops.choose_path(m, (9, 0), True, small) for m in (2, 3, 4)] == ["gemv", "gemv", "gemv_tc"]
    assert all(awq_ops.choose_path(m, (9, 0), True, kv) != "gemv_tc" for m in range(1, 65))
    assert all(awq_ops.choose_path(m, (9, 0), False, gate_up) != "gemv_tc" for m in range(1, 9))
    assert all(awq_ops.choose_path(m, (8, 0), True, gate_up) != "gemv_tc" for m in range(1, 9))
    assert [awq_ops.gemv_tc_units(i, o) for i, o in ((4096, 28672), (2720, 1000), (128, 8))] == [
        448 * 64, 16 * 43, 2]


def test_grouped_wgmma_one_cta() -> None:
    """k = 5's grouped wgmma takes the 32-copy table at one CTA per SM where the CTAs expected to find
    work fit one per SM (seed 002's 8 experts at 8 and 64 tokens), the 8-copy one at two per SM on
    larger grids (256 tokens in 64-row tiles; Qwen3-MoE's 128 experts at 64 tokens); k <= 4 never."""
    sms = 132

    def one(rows: int, n_exp: int, in_f: int, out_f: int, bits: int = 5, wide: bool = True) -> bool:
        cost = dispatch.WGMMA_WIDE_TILE_COST[bits] if wide else None
        r, _, splits = dispatch.grouped_wgmma_config(rows, n_exp, in_f, out_f, sms, bits, wide_cost=cost)
        return dispatch.grouped_wgmma_one_cta(rows, n_exp, in_f, out_f, r, splits, sms, bits)

    assert one(8 * 8, 8, 2048, 512) and one(64 * 8, 8, 2048, 512) and one(64 * 8, 8, 512, 2048)
    assert not one(256 * 8, 8, 2048, 512, wide=False)
    assert one(256 * 8, 8, 2048, 512)  # 128-row tiles: 2 x 8 x 2 tiles x 4 splits
    assert not one(64 * 8, 128, 2048, 1536)
    assert not one(8 * 8, 8, 2048, 512, bits=4)


def test_grouped_wgmma_wide_rows() -> None:
    """The grouped wgmma kernels (wide_cost given: kbit's and, from session 30, awq_orin's) take
    128-row tiles where wgmma_wide_rows does for more than 64 expected rows per expert, unless their grid
    leaves a K split fewer than GROUPED_WIDE_MIN_STAGES stages, and K splits up to one wave of one
    CTA per SM with them."""
    from kbit_vllm.backends.cuda import awq_ops

    sms = 132

    def cfg(rows: int, n_exp: int, in_f: int, out_f: int, sms: int, bits: int, wide: bool = False):
        cost = dispatch.WGMMA_WIDE_TILE_COST[bits] if wide else None
        return dispatch.grouped_wgmma_config(rows, n_exp, in_f, out_f, sms, bits, wide_cost=cost)

    assert cfg(128 * 8, 8, 512, 2048, sms, 4, wide=True)[0] == 64  # 128-row grid: 2 splits of 4 stages
    assert cfg(256 * 8, 8, 512, 2048, sms, 4, wide=True)[::2] == (128, 1)  # 8 stages, no split
    assert cfg(128 * 8, 8, 2048, 512, sms, 5, wide=True)[0] == 64  # 8 splits of 4 stages
    assert awq_ops.grouped_wgmma_config(2048 * 8, 128, 2048, 1536, sms)[0] == 128
    assert awq_ops.grouped_wgmma_config(512 * 8, 128, 2048, 1536, sms)[0] == 64
    assert cfg(256 * 8, 8, 2048, 512, sms, 4, wide=True) == (128, 23, 4)    # 32 tiles
    assert cfg(512 * 8, 8, 2048, 512, sms, 4, wide=True)[::2] == (128, 2)  # 64 tiles
    assert cfg(1024 * 8, 8, 2048, 512, sms, 4, wide=True)[::2] == (128, 1)  # 128 tiles: one wave
    assert cfg(1024 * 8, 128, 2048, 1536, sms, 4, wide=True)[0] == 64  # 64 expected rows per expert
    assert cfg(2048 * 8, 128, 2048, 1536, sms, 4, wide=True)[0] == 128
    assert cfg(2048 * 8, 128, 2048, 1536, sms, 5, wide=True)[0] == 128
    assert cfg(4096 * 8, 128, 2048, 1536, sms, 4, wide=True)[0] == 128
    assert cfg(4096 * 8, 128, 2048, 1536, sms, 4)[0] == 64
    assert cfg(64 * 8, 128, 2048, 1536, sms, 4, wide=True)[0] == 16  # decode batches as before


def test_awq_grouped_wgmma_config() -> None:
    """The grouped wgmma kernel's row tile holds the rows per expert (64 or 128 past it), the
    item bound covers every expert's tiles, and K splits only fill an under-used GPU: past half an
    SM's worth of CTAs only while the fp32 partials stay small beside the weights (H200 session 10)."""
    from kbit_vllm.backends.cuda import awq_ops

    sms = 132
    assert awq_ops.grouped_wgmma_config(512, 8, 2048, 512, sms) == (64, 15, 8)     # 16 CTAs: split
    assert awq_ops.grouped_wgmma_config(2048, 8, 512, 2048, sms)[::2] == (128, 1)  # 128 CTAs, big partials
    assert awq_ops.grouped_wgmma_config(64, 128, 2048, 768, sms) == (16, 64, 2)    # 192 CTAs, small partials
    assert awq_ops.grouped_wgmma_config(8192, 128, 2048, 768, sms)[::2] == (64, 1)  # prefill: one wave+
    for rows, n_exp in ((1, 8), (29, 6), (1000, 128)):
        r, items, _ = awq_ops.grouped_wgmma_config(rows, n_exp, 1024, 256, sms)
        assert r in (16, 32, 64) and items * r >= rows
    assert awq_ops.grouped_wgmma_config(100, 8, 1024, 256, sms, tile_rows=32)[0] == 32


def test_grouped_wgmma_short_tile_splits() -> None:
    """Row tiles up to GROUPED_SHORT_TILE_ROWS split K down to GROUPED_MIN_SPLIT_STAGES stages a split
    and at most GROUPED_MAX_SPLITS splits (seed 002's 512x2048 at 8 and 16 tokens: 4 splits, where
    4 stages a split allowed 2), k <= 4; k = 5 keeps 4 stages a split; 64-row tiles split only past
    GROUPED_UNSPLIT_MAX_STAGES stages (512x2048 at 32 and 64 tokens: unsplit)."""
    sms = 132

    def cfg(rows: int, in_f: int, out_f: int) -> tuple[int, int, int]:
        return dispatch.grouped_wgmma_config(rows, 8, in_f, out_f, sms, 4, wide_cost=dispatch.wgmma_wide_tile_cost(4))

    assert cfg(8 * 8, 512, 2048) == (16, 11, 4)
    assert cfg(16 * 8, 512, 2048) == (32, 11, 4)
    assert cfg(32 * 8, 512, 2048)[::2] == (64, 1)  # 64-row tiles of 8 stages: unsplit
    assert cfg(64 * 8, 512, 2048)[::2] == (64, 1)
    assert cfg(64 * 8, 2048, 512)[::2] == (64, 8)  # 32 stages in 16 unsplit CTAs: split
    assert cfg(8 * 8, 2048, 512)[2] == dispatch.GROUPED_MAX_SPLITS == 8  # 16 tiles, 32 stages
    assert cfg(8 * 8, 128, 2048)[2] == 1  # 2 stages: one split of GROUPED_MIN_SPLIT_STAGES
    k5 = dispatch.grouped_wgmma_config(8 * 8, 8, 512, 2048, sms, 5, wide_cost=dispatch.wgmma_wide_tile_cost(5))
    assert k5[2] == 2  # k = 5 keeps 4 stages a split (its one-CTA table)


def test_kbit_grouped_wgmma_rows() -> None:
    """H200: the kbit grouped op takes the grouped wgmma kernel from 8 rows per expert, or 4 with
    256 rows in all; elsewhere (and on other GPUs) the GEMV / MMA rules stand."""
    assert dispatch.grouped_wgmma_rows(64, 8, (9, 0))         # seed 002 at 8 tokens: 8 rows per expert
    assert not dispatch.grouped_wgmma_rows(32, 8, (9, 0))     # 4 rows per expert, 32 rows
    assert dispatch.grouped_wgmma_rows(512, 128, (9, 0))      # Qwen3-MoE at 64 tokens: 4 per expert
    assert not dispatch.grouped_wgmma_rows(128, 128, (9, 0))  # 1 row per expert: the GEMV
    assert not dispatch.grouped_wgmma_rows(4096, 8, (8, 0))
    # k = 5 alike (its stream-K GEMV beats the wgmma kernel at one row per expert)
    assert not dispatch.grouped_wgmma_rows(32, 128, (9, 0), k=5)  # Qwen3-MoE at 4 tokens: the GEMV
    assert not dispatch.grouped_wgmma_rows(128, 128, (9, 0), k=5)
    assert dispatch.grouped_wgmma_rows(512, 128, (9, 0), k=5)
    assert not dispatch.grouped_wgmma_rows(32, 8, (9, 0), k=5)    # seed 002 at 4 tokens: the GEMV
    assert dispatch.grouped_wgmma_rows(64, 8, (9, 0), k=5)
    assert not dispatch.grouped_wgmma_rows(4096, 128, (8, 0), k=5)


def test_kbit_grouped_slot_gemv_units() -> None:
    """H200: the grouped GEMV path takes the slot GEMV over stream-K up to 6144 (slot, tile, block)
    units for k <= 4 (Qwen3-MoE shapes at 2 tokens, not 3) and 2048 for k = 5 (whose slot GEMV
    decodes by lane shuffle)."""
    qwen_t1 = (8, 6, 64)   # Qwen3-MoE gate at 1 token: 3072 units
    seed_t1 = (8, 4, 64)   # seed 002's 8 experts at 1 token: 2048
    assert dispatch.grouped_slot_gemv(*qwen_t1, (9, 0)) and dispatch.grouped_slot_gemv(*qwen_t1, (9, 0), 4)
    assert not dispatch.grouped_slot_gemv(*qwen_t1, (9, 0), 5)
    assert dispatch.grouped_slot_gemv(*seed_t1, (9, 0), 5)
    assert dispatch.grouped_slot_gemv(16, 6, 64, (9, 0), 4)  # 2 tokens: 16 slots, 6144 units
    assert dispatch.grouped_slot_gemv(16, 16, 24, (9, 0), 4)  # its down projection
    assert not dispatch.grouped_slot_gemv(24, 6, 64, (9, 0), 4)  # 3 tokens
    # and at most 12 blocks a slot GEMV warp (its grid at 2 tokens: the gate 16, the down projection 12)
    assert not dispatch.grouped_slot_gemv(16, 6, 64, (9, 0), 4, warp_blocks=16)
    assert dispatch.grouped_slot_gemv(16, 16, 24, (9, 0), 4, warp_blocks=12)
    sms = 132
    for n, nb, slots, slot in ((768, 64, 8, True), (2048, 24, 8, True), (512, 64, 8, True), (2048, 16, 8, True),
                               (768, 64, 16, False), (2048, 24, 16, True)):  # Qwen3-MoE / seed 002 at 1, 2 tokens
        wk = grouped_gemv_config(n, nb, slots, sms)[1]
        assert dispatch.grouped_slot_gemv(slots, -(-n // 128), nb, (9, 0), 4, -(-nb // wk)) == slot, (n, nb, slots)


def test_slot_gemv_config_spreads_k_over_the_warps_that_fit() -> None:
    """The slot GEMV's warps along K: as many as ~16 warps an SM allow, down to one load group (4
    blocks) each, CTAs of at most 16 warps (8 where a row group takes fewer), and a grid past 16
    warps an SM only at one warp along K."""
    sms = 132
    assert grouped_gemv_config(512, 64, 8, sms) == (1, 16)   # seed 002's gate at 1 token: 4 blocks a warp
    assert grouped_gemv_config(2048, 16, 8, sms) == (2, 4)   # its down
    assert grouped_gemv_config(768, 64, 8, sms) == (1, 8)    # Qwen3-MoE gate at 1 token (16 would not fit)
    assert grouped_gemv_config(2048, 24, 8, sms) == (2, 4)   # its down
    assert grouped_gemv_config(2048, 24, 16, sms) == (4, 2)  # 16 slots: the grid allows only 2 along K
    assert grouped_gemv_config(4096, 2, 8, sms) == (8, 1)    # fewer blocks than a group
    for n in (128, 512, 768, 2048, 4096, 14336):
        for nb in (1, 4, 8, 16, 24, 64, 128, 448):
            for slots in (1, 2, 8, 16, 64, 128):
                rgpc, wk = grouped_gemv_config(n, nb, slots, sms)
                n_rg = 4 * (-(-n // 128))
                assert wk in (1, 2, 4, 8, 16) and rgpc * wk <= GGEMV_MAX_WARPS and rgpc <= max(1, n_rg)
                assert wk == 1 or nb >= wk * GGEMV_GROUP_BLOCKS, (n, nb, slots, rgpc, wk)
                warps = n_rg * slots * wk
                assert wk == 1 or warps <= 16 * sms, (n, nb, slots, rgpc, wk)
                assert wk == 16 or 2 * warps > 16 * sms or nb < 2 * wk * GGEMV_GROUP_BLOCKS, (n, nb, slots, wk)


def test_moe_fused_takes_few_pairs_over_many_experts(monkeypatch) -> None:
    """The fused MoE kernel (one read of an expert's weights a pair) takes up to 32 (token, expert)
    pairs and no more pairs than experts; the five ops (one read an expert) take the rest."""
    monkeypatch.delenv(dispatch.DETERMINISTIC_ENV, raising=False)
    assert dispatch.moe_fused(8, 128) and dispatch.moe_fused(32, 128)   # Qwen3-MoE at 1 and 4 tokens
    assert not dispatch.moe_fused(64, 128)                              # 8 tokens
    assert dispatch.moe_fused(8, 8) and not dispatch.moe_fused(16, 8)   # seed 002's 8 experts at 1 and 2 tokens
    assert not dispatch.moe_fused(0, 8)
