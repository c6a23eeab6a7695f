"""kbit_linear's choice of kernel by M (rows of x), one table per GPU architecture; below, the
grouped (MoE) ops' choice by the expected rows per expert.

Filled from benchmarks/bench_kbit.py on the device (see benchmarks/RESULTS.md). Each entry:
(largest M for the GEMV, largest M for the MMA kernel); larger M dequantizes into a torch
buffer and calls torch's matmul (cuBLAS).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping

DETERMINISTIC_ENV = "KBIT_VLLM_DETERMINISTIC"
PDL_ENV = "KBIT_VLLM_PDL"


def deterministic() -> bool:
    """KBIT_VLLM_DETERMINISTIC=1: only kernels whose split-K sums run in a fixed order, so the
    same input gives the same bits (the stream-K GEMVs, the stream-K MMA and the grouped MMA's
    split-K otherwise add their partials with float atomics)."""
    return os.environ.get(DETERMINISTIC_ENV, "0") not in ("", "0", "false", "False")


def pdl() -> bool:
    """Programmatic dependent launch for the GEMVs (csrc/pdl.cuh, sm_90+): their launch, weight
    loads and table build overlap the previous kernel's tail. KBIT_VLLM_PDL=0 turns it off."""
    return os.environ.get(PDL_ENV, "1") not in ("", "0", "false", "False")


# (major, minor) -> (gemv_max_m, mma_max_m)
# H200 session 7: with MMA variant 5, M=4 runs the MMA; k=4 fp16 µs GEMV (op) / MMA: Llama-3-8B
# layers summed 80.1 / 80.2 (4096x28672 34.6 / 38.3, 14336x4096 21.0 / 20.4), seed-002 shapes summed
# 45.2 / 35.5. At M=2 the GEMV still wins on the large layers (28.4 / 39.9, 17.6 / 21.0).
THRESHOLDS: dict[tuple[int, int], tuple[int, int]] = {
    # H200, benchmarks/RESULTS.md 2026-11-21 (one-wave MMA rewrite), k=4 fp16/bf16, summed over the
    # four Llama-3-8B layers: the MMA beats dequant + cuBLAS at M=32 (165 vs 279 us) and M=64 (242 vs
    # 273 us; it loses on 4096x6144 / 4096x4096 there and wins on the two large layers).
    (9, 0): (3, 64),
}
DEFAULT = (4, 16)
GEMV_MAX_M = 4  # the GEMV kernel is instantiated for M = 1..4


def thresholds(capability: tuple[int, int]) -> tuple[int, int]:
    """(gemv_max_m, mma_max_m) for a compute capability."""
    return THRESHOLDS.get(capability, DEFAULT)


def stream_k_grid(wave: int, units: int, warps_per_cta: int, min_units_per_warp: float | None,
                  forced: bool = False) -> int:
    """CTAs of a stream-K GEMV grid: one wave where every warp gets at least min_units_per_warp
    work units, else 0 (the caller runs its other GEMV; None: never). forced (tests, benchmarks),
    or min_units_per_warp 0: any grid with >= 1 unit per warp, 0 when even one CTA has too few."""
    if forced or min_units_per_warp == 0:
        return min(wave, units // warps_per_cta)
    if min_units_per_warp is None or units < wave * warps_per_cta * min_units_per_warp:
        return 0
    return wave


# The kbit stream-K GEMV at M=1 (k <= 4, three CTAs of 8 warps an SM) runs two CTAs an SM where the
# full wave would give its warps fewer than SK_M1_FULL_WAVE_FROM units each: fewer, longer ranges
# (fewer partial tiles, reductions and prologues a unit) beat the third CTA's extra loads in flight
# there. H200 session 39, behind a writer, k=4 µs full wave / two an SM (units a warp of the full
# wave), bf16: 4096x5120 (1.6) 9.3 / 8.3, 4096x6144 (1.9) 10.1 / 8.9, 4096x8192 (2.6) 10.8 / 10.0,
# 8192x4096 (2.6) 10.8 / 9.7, 14336x4096 (4.5) 13.7 / 13.2, 4096x14336 (4.5) 13.5 / 12.8, 8192x8192
# (5.2) 15.0 / 14.2, 4096x20480 (6.5) 16.9 / 16.7, 4096x28672 (9.1) 23.1 / 23.6; fp16 the same to
# within 0.4 but 4096x20480 17.6 / 16.9 and 4096x28672 22.8 / 23.6. Whether the stream-K GEMV runs
# at all (SK_MIN_UNITS in ops.py) is still decided on the full wave: 4096x4096 (1.3) gets 7.1 at two
# an SM, the cluster GEMV 6.7.
SK_M1_FULL_WAVE_FROM = 6.0


def stream_k_m1_ctas(grid: int, sms: int, units: int, warps_per_cta: int) -> int:
    """The M=1 kbit stream-K grid (k <= 4): two CTAs an SM instead of grid (a wave of three) where
    the wave gives fewer than SK_M1_FULL_WAVE_FROM units a warp; grid itself otherwise (or when it
    is already two an SM or fewer, or 0)."""
    if grid > 2 * sms and units < grid * warps_per_cta * SK_M1_FULL_WAVE_FROM:
        return 2 * sms
    return grid


# The row-slice GEMV (csrc/kbit_gemv_rows.cu, M=1, k <= 4): a CTA of 8 warps owns a slice of
# ROWS_SLICES output rows over the whole K (x staged whole: at most ROWS_MAX_BLOCKS input blocks),
# so no partial sum leaves it: no workspace, no atomics, a fixed order of additions. It wins where
# the stream-K GEMV's reduction and arrival are a large part of a short call, and loses where many
# input blocks per slice wait on one load at a time (fewer bytes in flight than the stream-K GEMV's
# whole units). H200 session 41, bf16 behind a writer, µs row-slice (best slice) / the op before
# (stream-K or cluster GEMV), k = 4 / 3 / 2: 2048x512 3.1 / 4.7, 2.9 / 4.7, 2.8 / 4.6; 2048x2048
# 4.4 / 5.0, 4.4 / 5.3, 4.1 / 5.2; 2048x3072 4.9 / 5.1, 5.0 / 5.4, 4.5 / 5.2; 2048x5120 6.0 / 6.6,
# 6.1 / 7.0, 5.4 / 7.0; 2048x8192 6.3 / 7.1, 6.4 / 7.1, 5.7 / 7.0; 3072x5120 7.6 / 7.9, 7.7 / 8.6,
# 6.6 / 8.5; 4096x4096 7.6 / 7.4, 7.6 / 7.5, 6.2 / 7.4; 8192x2048 8.3 / 8.9, 8.1 / 9.8, 6.5 / 9.5;
# 4096x6144 9.2 / 8.7, 9.3 / 8.5, 7.7 / 8.0; 2048x16384 9.2 / 9.6, 9.2 / 8.9, 7.6 / 8.4; 8192x4096
# 11.5 / 9.9, 11.6 / 9.2, 8.7 / 8.9; 14336x4096 18.6 / 13.3, 17.4 / 12.0, 13.4 / 11.1.
# Session 42: at k = 3, 4 from 3072 inputs the kernel requests a lane group's blocks four at a time
# (csrc/kbit_gemv_rows.cu rows_depth), one DRAM round trip where it waited on one a block, and takes
# layers up to 16 M weights with up to 8192 inputs from the stream-K and table GEMVs: bf16 behind a
# writer, µs row-slice (best slice) / the op before, k=4 4096x2048 5.5 / 5.8, 5120x2048 6.3 / 6.8,
# 4096x4096 7.0 / 7.5, 8192x2048 7.4 / 8.9, 8192x1024 6.0 / 6.9, 3072x3072 5.7 / 6.3, 3072x5120 7.5
# / 7.8; k=3 4096x2048 4.9 / 6.0, 5120x2048 6.1 / 7.3, 4096x4096 7.0 / 7.5, 8192x2048 7.2 / 8.4,
# 8192x1024 6.3 / 7.4 (k=4 4096x6144 9.1 / 8.8, 12288x1024 7.7 / 7.1 and the larger layers stay).
# Rules (k, inputs at most, weights at most): the first one the layer meets takes the kernel.
ROWS_RULES: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((2, 16384, 16 << 20), (2, 4096, 32 << 20), (3, 8192, 16 << 20), (4, 8192, 16 << 20)),
}
ROWS_SLICES = (8, 16, 32, 64)
ROWS_MAX_BLOCKS = 512  # kStagedXSlots: x staged whole in the table's unused halves
# Slices of 32 rows measured best wherever they fill ~0.7 of the SMs (the same runs: 2048x3072 P = 8
# / 16 / 32 / 64 5.8 / 5.4 / 4.9 / 6.4, 2048x8192 12.8 / 9.6 / 6.3 / 7.2); fewer CTAs than that want
# smaller slices (2048x2048 4.8 / 4.4 / 4.7 / 6.3, 2048x512 3.1 / 3.4 / 3.8 / 5.5), more than one
# wave larger ones (2048x16384 - / 14.8 / 11.2 / 9.2).
ROWS_MIN_SM_FILL = 0.7


def gemv_rows_slice(out_features: int, nb: int, sms: int, ctas_per_sm: Mapping[int, int]) -> int:
    """Output rows per CTA of the row-slice GEMV (8, 16, 32 or 64): 32, or 64 where 32 would take
    more than one wave, halved while the grid fills fewer than ROWS_MIN_SM_FILL of the SMs; 0 where
    no slice fits one wave or x (nb blocks) does not fit its staging slots. ctas_per_sm: each slice's
    resident CTAs an SM for this k and nb, as the library reports them (three CTAs of 8 warps beside
    their 64 KB tables; two where k = 3, 4 request four blocks a lane group at a time, from 96 input
    blocks: csrc/kbit_gemv_rows.cu rows_depth); a slice missing or at 0 is not taken."""
    if nb > ROWS_MAX_BLOCKS or out_features <= 0 or sms <= 0:
        return 0
    fits = [r for r in ROWS_SLICES
            if r >= 32 and -(-out_features // r) <= ctas_per_sm.get(r, 0) * sms]
    if not fits:
        return 0
    rows = fits[0]
    while (rows > ROWS_SLICES[0] and -(-out_features // rows) < ROWS_MIN_SM_FILL * sms
           and ctas_per_sm.get(rows // 2, 0) > 0):
        rows //= 2
    return rows


def use_gemv_rows(k: int, in_features: int, out_features: int, capability: tuple[int, int]) -> bool:
    """Whether an M=1 kbit linear takes the row-slice GEMV (ROWS_RULES) on this compute capability."""
    weights = in_features * out_features
    return any(k == kk and in_features <= max_in and weights <= max_w
               for kk, max_in, max_w in ROWS_RULES.get(capability, ()))


# The MMA kernel variant the "mma" path runs from MMA_VARIANT_MIN_M rows (csrc/kbit_mma.cu MmaVar;
# its 32-row tile wins even at M=5: 4096x28672 54.4 / 49.3, 14336x4096 29.2 / 28.7, 4096x6144
# 17.5 / 16.8 µs default / v2). H200 2026-11-21 session 4, k=4 fp16, µs default / v2
# (1 CTA per SM, 4 blocks per stage, accumulator-order partials, pointer-stepped loads, scale
# table; v1 within 1 µs) / cuBLAS fp16: 4096x28672 M=16 54.5 / 50.1 / 62.5, M=32 70.7 / 51.4 /
# 63.5, M=64 106.2 / 72.3 / 65.4; 14336x4096 M=64 60.7 / 40.6 / 40.0 (bf16 the same within 1 µs).
MMA_VARIANT = 2
MMA_VARIANT_MIN_M = 1

# Above MMA_SMALL_LAYER_M rows, layers of at most MMA_SMALL_LAYER weights go to dequantize + cuBLAS.
# Same run, M=64, v2 / dequant + cuBLAS: 2048x5120 17.7 / 14.5, 2048x4096 17.6 / 13.3, 2048x512
# 10.5 / 8.1, 4096x2048 15.3 / 15.9, but 4096x6144 (25 M weights) 24.4 / 31.9; at M=32 the MMA wins
# or ties on all of them.
MMA_SMALL_LAYER_M = 32
MMA_SMALL_LAYER = 12 * 1024 * 1024


# Rules (layer weights above, first row, last row) for the Hopper wgmma kernel (csrc/kbit_wgmma.cu)
# where it can run (compute capability 9.0, k <= 4, an sm_90a library, not deterministic mode) on
# layers above MMA_SMALL_LAYER (smaller ones: WGMMA_SMALL_ROWS); the first rule the layer is above
# decides, the MMA below and dequantize + cuBLAS above its rows. H200, k=4 fp16 µs, mma (v5) or the
# op's dequantize + cuBLAS / wgmma, 4096x28672, 14336x4096, 4096x6144, 4096x4096: session 10 (row
# tiles of 16 / 32 / 64 x rows) M=16 39.1 / 41.8, 20.6 / 22.9, 12.2 / 13.3, 10.3 / 11.2; M=20
# 50.2 / 46.8, 25.8 / 25.5, 15.6 / 14.7, 13.6 / 12.9; M=32 50.9 / 46.5, 26.6 / 25.7, 16.1 / 14.6,
# 14.1 / 12.9. Session 29 (bf16 behind a writer of x, with the 128-row tile of wgmma_dense_rows),
# wgmma / dequantize + cuBLAS: 4096x28672 M=256 133.8 / 172.4, M=384 184.7 / 202.2, M=512 238.2 /
# 234.4; 14336x4096 M=256 70.3 / 92.1, M=384 97.6 / 111.1, M=512 125.7 / 119.7; 4096x6144 M=256
# 38.4 / 40.1, M=384 50.9 / 46.7; 4096x4096 (64-row tiles) M=192 28.8 / 30.7, M=256 30.3 / 28.2. At
# M=448 cuBLAS picks a slow kernel for 4096x28672 (269.3 µs against 158.8 at M=512; dequantize +
# cuBLAS 346.0), where four 128-row tiles take about what they take at 512. Session 32, with the
# 256-row tall tile (WGMMA_TALL_TILES), tall tile / dequantize + cuBLAS: 4096x28672 M=768 301.6 /
# 322.4, M=1024 403.2 / 391.1; 14336x4096 M=512 109.6 / 118.7, M=768 157.7 / 153.9; 4096x6144 M=384
# (128-row tiles) 50.3 / 46.1, M=512 56.2 / 54.2. With the 192-row tall tile (WGMMA_TALL_TILES):
# 14336x4096 M=576 122.7 / 137.4, M=640 (128-row tiles) 145.9 / 136.1; 4096x6144 M=320 44.2 / 49.4,
# M=384 44.4 / 45.8, M=576 61.2 / 61.5; 4096x4096 M=320 32.0 / 29.7. Session 33, with the 320- and
# 384-row tiles: 4096x28672 M=896 327.0 (320) / 366.5, M=1024 396.1 (384) / 392.6, M=1280 466.2 /
# 490.7 (cuBLAS 399.2, dequantize + cuBLAS kept: its time is the GEMM's plus a fixed write);
# 14336x4096 M=640 118.2 / 135.5, M=768 139.9 / 153.6, M=896 172.2 / 183.8, M=1024 194.0 / 189.2.
# Session 36 (bf16 behind a writer, k = 4 / 3 / 2, wgmma minus MMA µs at M = 9..16): 4096x28672
# -1.4..-1.7 / -0.4..-1.3 / -0.1..+0.8, so its rows start at 9 (M <= 8 is the tensor-core GEMV's);
# 14336x4096 -0.1..-0.4 / +0.1..+0.3 / +0.4..+0.7, so 17 stays; 20-40 M layers -0.1..-1.0 on
# 4096x6144, 4096x5632, 4096x8192, 2048x12288 (k=2 alike) and 0..+0.2 on 8192x3072, 4096x7168, so
# 9; 4096x4096 -0.4..+0.3, so 17 stays.
# Session 40: the 16- and 32-row tiles got faster (the 64 KB pair table, csrc/kbit_wgmma_tile.cuh
# WgCfg::kWide), and the kernel now beats the MMA and the tensor-core GEMV from M=4 on layers of
# 12-40 M weights and from M=7 (k=4) / 8 (k = 2, 3: TC_ROWS keeps 7) on 40-100 M ones. bf16 behind a
# writer, µs wgmma / the op before, k=4: M=4 4096x6144 11.8 / 12.7, 8192x3072 11.9 / 13.5, 4096x8192
# 13.6 / 14.0, but 2048x12288 12.1 / 11.8; M=5 4096x5632 11.4 / 12.8, 4096x6144 12.1 / 13.2; M=7
# 14336x4096 19.3 / 21.0, 8192x8192 21.7 / 24.0 (the tensor-core GEMV 21.8; at M=6 21.4 against its
# 21.0); M=8 4096x8192 13.7 / 15.6, 14336x4096 19.5 / 20.9, 8192x8192 21.5 / 23.9, 4096x4096 10.2 /
# 11.3; M=16 14336x4096 20.0 / 21.9, 8192x8192 21.5 / 24.0, 4096x4096 10.4 / 11.2; k=2 M=8 14336x4096
# 18.4 / 19.3, 8192x8192 19.8 / 20.3. M=3 stays with the tensor-core GEMV or the GEMV (the wgmma
# kernel wins on some layers, loses on 4096x8192, 4096x5632, 2048x12288 by 0.3-0.9).
WGMMA_RULES: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((100 << 20, 9, 960), (40 << 20, 7, 960), (20 << 20, 4, 384), (0, 4, 192)),
}
# The same on layers of at most MMA_SMALL_LAYER weights (k <= 4): rules (weights above, first row,
# last row), the first rule the layer is above decides. The wgmma kernel runs one CTA per SM there
# (WGMMA_ONE_CTA). H200 2026-11-27 session 28, bf16 behind a writer of x, k=4 µs wgmma / the MMA or
# dequantize + cuBLAS the op took before (k=2 alike): M=17 2048x5120 10.7 / 14.1, 5120x2048 10.5 /
# 11.9, 2048x4096 9.5 / 11.7, 4096x2048 9.6 / 11.6, 2048x512 7.1 / 7.8; M=64 14.1 / 14.8, 13.8 /
# 18.2, 12.4 / 13.4, 12.5 / 16.2, but 2048x512 9.5 / 8.5 (dequantize from M=48); M=96 17.8 / 15.5
# (dequantize), 17.3 / 19.1, 15.2 / 13.6 (dequantize), 15.8 / 17.0; M=192 dequantize on all.
# Session 36 (bf16 behind a writer, k = 2, 3, 4): at M = 4..16 the wgmma kernel beat the MMA on all
# five of seed 002's layers by 0.2-0.9 µs (k=4 M=8: 2048x5120 9.9 / 10.3, 5120x2048 9.3 / 9.6,
# 2048x4096 8.5 / 8.9, 4096x2048 8.6 / 9.1, 2048x512 6.0 / 6.3), so its rows start at 4.
WGMMA_SMALL_ROWS: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((2 << 20, 4, 64), (0, 4, 32)),
}
# k = 5 (its 10-bit pair table, csrc/kbit_lut5.cuh), which has no MMA variant 5: rules (layer weights
# above, first row, last row), the first rule the layer is above decides; the tensor-core GEMV's
# (TC_ROWS_K5) come first, the GEMV ("gemv": the stream-K table GEMV where ops.SK_MIN_UNITS_K5
# allows, else the lane-shuffle one) and the MMA's variant 2 take what neither takes. H200
# 2026-11-27 session 26, bf16 behind a writer of x, µs
# wgmma / MMA v2 / dequantize + cuBLAS (cuBLAS bf16): 4096x28672 M=5 48.0 / 77.6, M=8 47.4 / 79.0
# (61.7), M=64 60.5 / 99.4 (65.6), M=128 106.6 / 152.7 (dequantize), M=192 149.4 / 163.9;
# 14336x4096 M=8 27.8 / 43.1 (34.3), M=192 82.1 / 91.6; 4096x6144 M=8 16.0 / 22.1 (16.9), M=128
# 35.0 / 36.2, M=192 48.2 / 43.2; 4096x4096 M=128 26.2 / 27.7, M=192 34.9 / 31.8; 2048x5120 (10 M)
# M=8 11.0 / 14.2, M=64 14.6 / 19.0 / 15.1, M=128 19.9 / 15.5; 5120x2048 M=64 15.4 / 18.6. At M <=
# 4, µs tensor-core GEMV / wgmma / lane-shuffle GEMV: 4096x28672 M=1 43.7 / 47.5 / 51.3, M=4 47.5 /
# 48.3 / 76.2; 14336x4096 M=1 26.5 / 27.3 / 31.8, M=2 27.3 / 27.7 / 34.4, M=3 27.6 / 27.5 / 39.4;
# 4096x6144 M=1 16.0 / 15.8 / 16.0, M=2 16.5 / 16.0 / 18.3; 4096x4096 M=2 13.8 / 13.4 / 11.9, M=3
# 14.9 / 13.4 / 13.7; 2048x5120 M=2 12.1 / 11.1 / 10.5, M=3 12.4 / 11.0 / 11.8; 5120x2048 M=2 12.7 /
# 10.6 / 12.7, M=3 12.8 / 10.8 / 14.9. Session 28 (the wgmma kernel on its 32-copy table, one CTA per
# SM), wgmma / dequantize + cuBLAS: 4096x6144 M=128 29.8 / 36.1, M=192 39.9 / 43.1, M=256 49.9 / 41.6;
# 4096x4096 M=128 23.0 / 27.2, M=192 29.5 / 31.6, M=256 36.6 / 28.8; 5120x2048 M=128 19.6 / 21.1,
# 2048x5120 18.6 / 15.6, 2048x4096 16.5 / 15.3 (the small layers keep M <= 64). At M=1, µs
# tensor-core GEMV / wgmma / lane-shuffle GEMV: 4096x6144 15.7 / 15.1 / 15.8 (session 26: 16.0 /
# 15.8 / 16.0), 4096x4096 12.7 / 12.0 / 10.9. Session 29, with the 128-row tile (wgmma_dense_rows),
# wgmma / dequantize + cuBLAS: 4096x28672 M=256 140.8 / 176.2, M=384 193.3 / 208.6, M=512 251.1 /
# 239.6; 14336x4096 M=256 73.8 / 94.3, M=384 105.8 / 114.6, M=512 131.9 / 122.1; 4096x6144 M=256
# 39.6 / 42.3, M=384 52.3 / 49.7; 4096x4096 M=192 29.9 / 32.3, M=256 31.3 / 29.5; 4096x28672 M=448
# dequantize + cuBLAS 351.2 (WGMMA_RULES). Session 32, with the tall tile (WGMMA_TALL_TILES), tall
# tile / dequantize + cuBLAS: 4096x28672 M=512 219.9 / 236.2, M=768 315.7 / 324.8; 14336x4096
# M=512 114.0 / 121.0, M=768 164.9 / 156.2; 4096x6144 M=384 (128-row tiles) 50.1 / 47.8. Session 33,
# with the 320- and 384-row tiles: 14336x4096 M=640 126.2 / 138.5, M=768 140.9 / 157.1.
# Session 34, with the k=5 stream-K table GEMV (csrc/kbit_gemv_sk.cu, 16 warps a CTA beside a 128 KB
# table), bf16 behind a writer of x, µs stream-K / lane-shuffle / tensor-core GEMV / wgmma:
# 4096x28672 M=1 25.7 / 50.9 / 44.2 / 46.6, M=2 36.1 / 57.8 / 45.7 / 47.6, M=3 41.7 / 65.4 / 45.1 /
# 46.5, M=4 49.3 / 76.3 / 47.3 / 46.8; 14336x4096 M=1 15.5 / 31.8 / 26.6 / 26.0, M=2 24.3 / 34.9 /
# 27.3 / 25.7, M=3 28.1 / 40.0 / 27.7 / 26.0; 4096x6144 M=1 9.5 / 16.0 / 15.6 / 14.7, M=2 13.8 / 18.4
# / 16.3 / 14.6, M=3 15.8 / 21.0 / 16.5 / 14.8; 4096x4096 M=1 8.4 / 11.2 / 13.0 / 11.5, M=2 12.2 /
# 12.0 / 13.4 / 11.5; seed 002's layers M=1 2048x5120 6.8 / 9.5 / 11.4 / 9.6, 5120x2048 8.1 / 11.5 /
# 11.9 / 9.3, 2048x4096 7.1 / 7.3 / 10.9 / 8.6, 4096x2048 7.6 / 9.6 / 11.1 / 8.7, 2048x512 5.8 / 5.9
# / 9.9 / 5.7; M=2 11.1 / 10.4 / 11.9 / 9.6, 13.4 / 12.7 / 12.0 / 9.4, 11.1 / 7.8 / 11.3 / 8.7, 11.5
# / 10.6 / 11.7 / 8.8, 7.3 / 6.5 / 10.1 / 5.8. So the stream-K GEMV takes M=1 everywhere, M=2 above
# 20 M weights and M=3 above 100 M (ops.SK_MIN_UNITS_K5), the wgmma kernel the rest from M=2 (the
# tensor-core GEMV no longer wins a row).
WGMMA_RULES_K5: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((100 << 20, 4, 768), (40 << 20, 3, 768), (20 << 20, 3, 256), (MMA_SMALL_LAYER, 2, 192), (0, 2, 64)),
}
TC_ROWS_K5: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): (),
}

# Layers (weights at most, first row) on which the wgmma kernel runs one CTA per SM instead of a
# full wave of two (k <= 4; k = 5 always runs one: its 128 KB table leaves no room for a second): on
# small layers a CTA has only a few stages, and a second one per SM (twice the CTAs, each with its
# prologue and its share of a split row tile) costs more than its overlap gains. H200 2026-11-22
# session 14, k=4 bf16, µs behind a kernel without PDL that writes x (as vLLM runs them), 132 / 264
# CTAs: 4096x4096 M=32 15.4 / 16.3, M=64 18.9 / 22.3; 4096x6144 M=32 18.8 / 18.1, M=64 22.2 / 23.6;
# 14336x4096 M=64 37.8 / 34.9.
WGMMA_ONE_CTA: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {
    (9, 0): ((17 << 20, 17), (26 << 20, 33)),
}


def wgmma_one_cta(capability: tuple[int, int], weights: int, m: int,
                  rules: dict[tuple[int, int], tuple[tuple[int, int], ...]] | None = None) -> bool:
    """Whether the wgmma kernel runs one CTA per SM for an m-row activation of a layer with that
    many weights: rules (weights at most, first row) per capability, the kbit kernel's
    WGMMA_ONE_CTA unless given (awq_ops.WGMMA_ONE_CTA for awq_orin)."""
    table = WGMMA_ONE_CTA if rules is None else rules
    return any(weights <= w and m >= r for w, r in table.get(capability, ()))


# Layers (weights at most, first row, last row) whose wgmma launch splits each row tile's stages over
# a cluster instead of stream-K over one wave (ops.wgmma_ck_config, k <= 4): on small layers the
# stream-K kernel's partial row tiles (an fp32 reduction in L2, a counter and the last CTA's read
# back) cost as much as its stages at 64-row tiles, and a cluster adds its CTAs' sums in shared
# memory; where its grid (row tiles x cluster size, every cluster resident at once) fills at least
# WGMMA_CK_MIN_FILL of the SMs. H200 2026-11-30 session 49, k=4 bf16 behind a writer of x, M=64 µs
# cluster / stream-K (cuBLAS bf16): 2048x5120 12.2 / 14.5 (8.4), 2048x4096 11.4 / 12.2 (7.5),
# 4096x6144 18.6 / 19.6 (17.5), 4096x3072 13.1 / 13.7 (10.9), 4096x4096 15.4 / 15.3 (12.7), k=2
# alike; 5120x2048 (64 CTAs) 14.2 / 13.7; M=16..32 and the layers above 26 M weights lose (14336x4096
# M=16 27.8 / 18.8: fewer CTAs, each with more stages). Without the L2 reduction the stream-K kernel
# took 2048x5120 M=64 in 7.3 µs (RESULTS.md, session 49).
WGMMA_CK_RULES: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((26 << 20, 33, 64),),
}
WGMMA_CK_MIN_FILL = 0.7
WGMMA_CK_MAX_SPLITS = 8  # CTAs of a cluster at most (the portable cluster size)
WGMMA_CK_MAX_ROWS = 64  # x rows of a row tile at most (both kernels: two m64 tiles a warpgroup)


def wgmma_ck_rule(capability: tuple[int, int], weights: int, m: int,
                  rules: Mapping[tuple[int, int], tuple[tuple[int, int, int], ...]] | None = None) -> bool:
    """Whether a wgmma launch of m rows on a layer of that many weights splits K over clusters:
    rules (weights at most, first row, last row) per capability, the kbit kernel's WGMMA_CK_RULES
    unless given (awq_ops.WGMMA_CK_RULES for awq_orin); the caller also checks the grid's fill
    (WGMMA_CK_MIN_FILL)."""
    table = WGMMA_CK_RULES if rules is None else rules
    return any(weights <= w and lo <= m <= hi for w, lo, hi in table.get(capability, ()))


def wgmma_ck_fills(cfg: tuple[int, int, int] | None, sms: int) -> bool:
    """Whether a split-K launch's (rows, splits, row_tiles) config has a grid (row tiles x splits)
    of at least WGMMA_CK_MIN_FILL of the sms SMs (None: no config)."""
    return cfg is not None and cfg[1] * cfg[2] >= WGMMA_CK_MIN_FILL * sms


def wgmma_ck_path_splits(path: str, op: str) -> int | None:
    """The cluster size a forced path names ("wgmma_ck4": 4), None for "wgmma_ck" (the launch's own
    choice); a ValueError naming op for anything else."""
    tail = path[len("wgmma_ck"):]
    if not path.startswith("wgmma_ck") or (tail and (not tail.isdigit() or not 1 <= int(tail) <= WGMMA_CK_MAX_SPLITS)):
        raise ValueError(f"{op} {path!r} path: expected wgmma_ck (its own cluster size) or wgmma_ck1.."
                         f"wgmma_ck{WGMMA_CK_MAX_SPLITS}")
    return int(tail) if tail else None


def wgmma_ck_launch(cfg: tuple[int, int, int] | None, stages: int, op: str, path: str, shape: str,
                    max_rows: int) -> tuple[int, int, int]:
    """A split-K launch's (rows, splits, row_tiles) from its config (None: no row tile of at most
    max_rows rows or no cluster size fitting one wave), a ValueError naming op and path where the
    config is missing or has more splits than the layer's stages."""
    if cfg is None or cfg[1] > stages:
        raise ValueError(f"{op} {path!r} path takes row tiles of at most {max_rows} rows, at most one split per "
                         f"stage ({stages} here) and a cluster size that fits one wave, got {shape}")
    return cfg


def wgmma_ck_splits(row_tiles: int, stages: int, clusters: Callable[[int], int]) -> int | None:
    """The cluster size of a split-K wgmma launch: the one of 1..WGMMA_CK_MAX_SPLITS (at most the
    stages) that puts the most CTAs (row tiles x size) in one wave, every cluster resident at once
    (clusters(size): how many can be); the smaller on a tie; None where no size fits one wave."""
    best = None
    for s in range(1, min(WGMMA_CK_MAX_SPLITS, stages) + 1):
        if row_tiles <= clusters(s) and (best is None or row_tiles * s > best[0]):
            best = (row_tiles * s, s)
    return None if best is None else best[1]


def wgmma_even_grid(units: int, stages: int, ctas: int) -> int:
    """A one-wave wgmma grid of ctas CTAs over units (row tile, stage) units of stages stages per row
    tile, shrunk by at most 1/16 where that gives every CTA the same whole share of one row tile: no
    CTA runs a stage more than another, or ends in two row tiles (two partial tiles to reduce). H200
    session 28, bf16 µs: one CTA per SM, 128 / 132 CTAs: 4096x4096 (8 stages a CTA) k=5 M=32 13.1 /
    13.8, M=64 16.1 / 17.0, k=4 12.6 / 13.1, 15.8 / 16.5; 14336x4096 (28 stages) k=5 29.1 / 29.8,
    34.0 / 34.2. Two per SM, 256 / 264 CTAs, k=4: 14336x4096 M=16 20.9 / 21.5, M=32 24.6 / 25.4, M=64
    30.6 / 31.4; 4096x4096 M=16 11.1 / 11.5 (k=2 alike). Uneven counts gained nothing (4096x6144:
    120 / 128 / 132 CTAs k=5 M=64 19.7 / 20.7 / 19.9; 4096x28672 k=4 M=64 256 / 264: 52.2 / 51.6)."""
    for c in range(ctas, ctas - ctas // 16 - 1, -1):
        if c > 0 and units % c == 0 and stages % (units // c) == 0:
            return c
    return ctas


# Before any of those, the tensor-core GEMV (csrc/kbit_gemv_tc.cu, same conditions as wgmma): rules
# (layer weights above, first row, last row), the first rule the layer is above decides. H200
# 2026-11-22 session 12, k=4 fp16 µs, gemv_tc / the best other kernel (stream-K GEMV at M <= 3, MMA
# v5 above): 4096x28672 (117 M) M=1 26.9 / 23.5, M=2 27.7 / 28.2, M=4 29.3 / 34.5, M=8 32.6 / 36.9;
# 14336x4096 (59 M) M=2 16.5 / 17.2, M=4 17.7 / 19.7, M=8 20.2 / 19.8; 4096x6144 M=2 10.5 / 11.4,
# M=4 11.2 / 11.7, M=8 12.8 / 11.8; 4096x4096 M=2 8.3 / 9.3, M=4 9.8 / 9.6; 2048x5120 M=2 7.0 / 8.0,
# M=4 8.4 / 8.3. Session 17, behind a kernel without PDL that writes x (as vLLM runs them;
# `bench_kbit.py --behind-writer`), k=4 bf16, gemv_tc / the table GEMV at M=2 (fp16 alike):
# 2048x5120 10.1 / 8.1, 4096x2048 9.7 / 7.7, 4096x4096 11.6 / 9.5, 4096x6144 (25 M) 12.8 / 11.8,
# 14336x4096 18.6 / 24.1 (stream-K); M=3 4096x6144 13.6 / 13.6, 4096x4096 11.8 / 10.9. So M=2
# takes it only above 40 M weights. Session 36 (`bench_kbit.py --behind-writer --dtype bfloat16 --ks
# 4,2,3 --extra ...`, benchmarks/RESULTS.md), gemv_tc / the table GEMV or MMA, k=4 (k=2): M=2
# 4096x7168 (28 M) 13.2 / 14.1 (11.6 / 14.1), 4096x8192 14.3 / 14.4 (12.4 / 14.2), but 4096x6144
# 12.6 / 11.9 (11.1 / 11.2); M=3 4096x5120 (20 M) 11.7 / 13.9 (10.5 / 13.8), 4096x4096 11.6 / 10.7;
# M=4 on 20-40 M layers it wins or ties on 4096- and 2048-wide inputs at k = 2, 3 (4096x5632 11.2 /
# 11.7, 4096x8192 13.5 / 13.9, 2048x12288 12.0 / 12.5 at k=2) but not on 8192-wide ones (8192x3072
# 14.4 / 12.8 at k=4); taking M=4 off it there lost 0.3-1.0 µs on the others, so it stays.
# Session 37: M=2 left it for the stream-K GEMV (x staged per warp, two units ahead), behind a writer,
# µs stream-K / tensor-core GEMV, k=4 bf16 (fp16): 4096x28672 23.8 / 29.9 (23.9 / 30.1), 14336x4096
# 16.6 / 18.8 (15.8 / 18.9), 4096x7168 11.6 / 13.5 (11.6 / 13.5); k=2 bf16 21.7 / 25.8, 15.3 / 16.6,
# 10.8 / 11.7.
# Session 39: the tensor-core GEMV's ring went from 4 slots to 2 (1-2 µs faster at every M), so it
# takes M = 5..8 above 40 M weights and M=5 above 30 M. Behind a writer, k=2 bf16, µs gemv_tc / the
# op before: M=5 14336x4096 17.4 / 18.8, 8192x8192 18.5 / 21.3, 4096x8192 (34 M) 13.1 / 14.4, but
# 4096x6144 (25 M) 12.4 / 11.8 (MMA); M=8 8192x8192 19.9 / 21.3, 14336x4096 18.9 / 19.0.
# Session 40: the wgmma kernel's faster small tiles (WGMMA_RULES) take M = 4..8 below 40 M weights and
# M=8 on 40-100 M layers. k=2 bf16 behind a writer, µs gemv_tc / wgmma: M=4 4096x6144 11.9 / 11.3,
# 4096x8192 13.3 / 12.9, 8192x3072 13.1 / 11.4, 2048x12288 11.2 / 11.7; M=7 14336x4096 18.6 / 18.5,
# 8192x8192 19.8 / 19.9; M=8 19.2 / 18.4, 20.1 / 19.8; 4096x28672 keeps M = 3..8 (M=8 29.7 / 31.5).
TC_ROWS: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((100 << 20, 3, 8), (40 << 20, 3, 7), (18 << 20, 3, 3)),
}
# k = 4 (its current rows: session 40, at the end). Session 37 kept M=4 off 18-40 M layers (behind
# a writer, gemv_tc / the faster of MMA and wgmma, M=4, fp16 x; bf16 within 0.3): 4096x6144 14.1 /
# 12.9, 8192x3072 13.7 / 12.6, 4096x5120 12.5 / 12.2, 4096x7168 15.2 / 14.5, 4096x5632 13.2 / 12.8,
# 2048x12288 13.6 / 13.6; k=2 kept it (4096x5120 11.3 / 11.5, 2048x12288 11.9 / 12.7, against
# 4096x6144 12.8 / 12.2).
# Session 38: the stream-K GEMV stages x at M = 3, 4 too, and at k=4 takes M=3 from the tensor-core
# GEMV on layers above 22 M weights, up to where a warp's units outgrow its staging share (20 units
# a warp at M=3, 165 M weights on 132 SMs; past it x is read per unit and loses). Behind a writer, µs
# stream-K / tensor-core GEMV, k=4 M=3 bf16 (fp16): 4096x28672 27.2 / 30.7 (26.6 / 31.2), 14336x4096
# 19.0 / 19.5 (17.9 / 19.3), 4096x6144 12.7 / 13.6 (12.7 / 13.6), 4096x7168 13.4 / 14.0, 4096x8192
# 13.3 / 14.7, 2048x12288 11.8 / 13.0, 5120x13824 18.9 / 21.6, 13824x5120 19.8 / 21.5, but 4096x5632
# (22 M) 12.7 / 12.4, 8192x3072 13.9 / 13.4 (the MMA 12.5), 8192x28672 (27 units a warp) 68.3 /
# 51.3. At M=4 (staged) it loses to the tensor-core GEMV or the MMA on all of them but 4096x28672
# fp16 (30.4 / 31.1), and at k = 2, 3 it wins only on some layers by up to 1 µs (k=2 14336x4096 M=3
# 19.2 / 17.1), so those keep their rows. A rule whose first row is past its last takes none.
# Session 39, the tensor-core GEMV's ring at 2 slots (above), k=4 bf16 behind a writer, µs gemv_tc /
# the op before: M=3 14336x4096 17.3 / 18.3 (but 8192x8192 19.0 / 18.6), 4096x8192 12.8 / 13.8,
# 4096x6144 11.8 / 12.2; M=4 4096x8192 13.2 / 15.2, 4096x6144 12.4 / 12.9; M=5 14336x4096 19.3 /
# 21.0, 8192x8192 20.3 / 23.7, 4096x8192 13.6 / 15.2, 4096x6144 12.9 / 12.9; M=8 14336x4096 22.0 /
# 20.9 (wgmma) and 4096x6144 13.7 / 13.1 keep theirs; 4096x28672 M=3 stays on the stream-K GEMV
# (26.3 / 28.7). So layers of 22-100 M weights take M = 3..5 (past 100 M, M=3 stays on the stream-K
# GEMV up to 165 M).
# Session 40: the wgmma kernel takes M >= 4 below 40 M weights and M >= 7 on 40-100 M layers
# (WGMMA_RULES has the measurements; at M = 5, 6 on 40-100 M layers, µs gemv_tc / wgmma: 14336x4096
# 19.8 / 19.4 and 20.0 / 19.3, 8192x8192 20.4 / 21.5 and 21.0 / 21.4).
TC_ROWS_K4: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((165 << 20, 3, 8), (100 << 20, 4, 8), (40 << 20, 3, 6), (18 << 20, 3, 3)),
}


def rule_takes(rules: tuple[tuple[int, int, int], ...], weights: int, m: int) -> bool:
    """Whether m lies in the row range of the first (weights above, first, last) rule the layer is
    above (the tensor-core GEMV and wgmma rules of both formats)."""
    rule = next((r for r in rules if weights > r[0]), None)
    return rule is not None and rule[1] <= m <= rule[2]


# x rows per row tile (the wgmma N) that every wgmma kernel (dense and grouped, kbit and awq) is
# built for, besides WGMMA_WIDE_ROWS (128) past 64 rows by the rules below.
WGMMA_ROW_TILES = (16, 32, 64)


def wgmma_tile_rows(m: int) -> int:
    """x rows per row tile of the wgmma kernels: the smallest built wgmma N that holds m (past 64
    rows, more row tiles), so a batch of 16 runs n16 wgmmas, not n64 over 48 rows of zeros."""
    return next((r for r in WGMMA_ROW_TILES if m <= r), WGMMA_ROW_TILES[-1])


# The dense kbit wgmma kernel (csrc/kbit_wgmma.cu) also has a 128-row tile: one decode of a stage
# feeds twice the rows' tensor work, at one CTA per SM. Past 64 rows, on layers above
# WGMMA_WIDE_ROWS_ABOVE weights, it runs where its tiles cost less than 64-row ones: a 128-row tile
# costs WGMMA_WIDE_TILE_COST[k] 64-row tiles. H200 2026-11-27 session 29, bf16 behind a writer of x,
# µs 64-row / 128-row tiles: 4096x28672 k=4 M=128 87.3 / 74.2, M=192 122.7 / 133.1, M=256 157.7 /
# 130.9, M=512 296.3 / 235.5; k=5 M=128 106.5 / 78.0, M=192 152.6 / 138.3, M=256 196.4 / 137.0;
# 14336x4096 k=4 M=128 47.8 / 42.1, M=192 68.0 / 70.1, M=256 82.7 / 69.0; k=5 M=192 80.7 / 73.2;
# 4096x6144 k=4 M=128 28.9 / 26.4, M=256 48.4 / 38.4; but 4096x4096 (its partial tiles' reduction
# weighs more) k=4 M=128 21.7 / 22.5, M=256 34.4 / 30.2 (dequantize + cuBLAS 28.2 there). The op
# with these rules, 4096x28672 k=4 M=320: 64-row tiles (cost 1.7) 188.9, at M=384 three 128-row tiles
# 179.0, hence 1.6.
WGMMA_WIDE_ROWS = 128
WGMMA_WIDE_ROWS_ABOVE: dict[tuple[int, int], int] = {
    (9, 0): 20 << 20,
}
WGMMA_WIDE_TILE_COST: dict[int, float] = {2: 1.6, 3: 1.6, 4: 1.6, 5: 1.4}


def wgmma_wide_tile_cost(k: int) -> float:
    """The kbit wgmma kernels' (dense and grouped) cost of a 128-row tile in 64-row tiles at k bits."""
    return WGMMA_WIDE_TILE_COST.get(k, 2.0)


# The dense kbit kernel's tall tiles: 160, 192, 256, 320 or 384 x rows of one 128-feature layout
# tile, one m64 tile of 64 features per warpgroup, so each decoded weight feeds that many rows
# (csrc/kbit_wgmma.cu).
# A tall tile costs WGMMA_TALL_TILES[rows][k] 64-row tiles (k = 5 on a 16- or 8-copy table: its
# 32-copy one leaves no room for the slots). H200 2026-11-28 session 32, bf16 behind a writer of x, k=4 µs
# 64- / 128- / 256-row tiles
# (`benchmarks/exp_wgmma_rows.py`): 4096x28672 M=192 124.0 / 127.5 / 119.5, M=256 159.5 / 128.7 /
# 116.3, M=384 228.3 / 178.0 / 235.6, M=512 298.1 / 231.7 / 210.5, M=768 428.6 / 331.3 / 301.6;
# 14336x4096 M=192 68.5 / 68.4 / 61.8, M=256 85.2 / 68.5 / 61.9, M=512 154.9 / 121.8 / 109.6;
# 4096x6144 M=256 48.7 / 37.6 / 35.4; at M=128 (one tile, half of it empty) 4096x28672 89.1 / 72.7 /
# 168.6. So a tall tile costs ~2.85 64-row ones, a 128-row one ~1.55. k=5: 4096x28672 M=192 145.3 /
# 132.1 / 122.0, M=256 189.6 / 133.7 / 122.0, M=384 275.9 / 185.9 / 236.6, M=512 363.6 / 239.5 /
# 219.9; 14336x4096 M=256 99.6 / 69.6 / 64.5, M=512 182.1 / 122.7 / 114.0: the tall tile ~2.45.
# With one commit group a block (kw_stage_blocks), k=4: 4096x28672 M=256 157.5 / 126.9 / 109.9, M=512
# 296.0 / 228.4 / 197.8, M=768 424.2 / 325.8 / 284.2; 14336x4096 M=256 85.4 / 67.5 / 58.8, M=512
# 153.1 / 119.9 / 104.1, M=768 219.6 / 170.6 / 148.1 (k=2 alike): ~2.7; k=5 (4096x28672 M=256 119.1,
# M=512 216.3) ~2.45.
# The 192-row tall tile (m64n192k16, 96 accumulators a thread): M=384 in two tiles. Session 32, µs
# 64- / 128- / 192- / 256-row tiles: 4096x28672 k=4 M=192 123.3 / 125.7 / 91.3 / 119.6, M=384 224.2 /
# 174.4 / 164.1 / 228.5, M=576 325.7 / 276.3 / 234.2 / 341.3; 14336x4096 k=4 M=192 67.0 / 66.8 /
# 48.6 / 57.0, M=384 118.0 / 92.5 / 84.3 / 99.9; k=5 4096x28672 M=384 274.4 / 185.9 / 187.4 / 212.4,
# M=576 402.8 / 288.4 / 269.3 / 346.1: ~2.2 64-row tiles (k=5 ~2.0). The 160-row one (m64n160k16)
# holds M=320 in two tiles: 64- / 128- / 160- / 192-row tiles, 4096x28672 k=4 M=320 191.4 / 174.0 /
# 151.8 / 161.6, M=640 356.9 / 275.1 / 282.1 / 297.7; 14336x4096 k=4 M=320 103.6 / 92.6 / 80.0 / 85.1;
# k=5 4096x28672 M=320 231.8 / 182.6 / 174.4 / 185.2; 4096x4096 k=4 M=128 21.9 / 22.1 / 19.7 / 21.8:
# ~1.95 (k=5 ~1.9).
# The 320- and 384-row tiles: two m64n160k16 / m64n192k16 on each decoded A fragment (one decode for
# all the rows, 160 / 192 accumulators a thread; the 384-row one has room for 3 slots). Session 33,
# µs 160- / 192- / 256- / 320- / 384-row tiles, k=4: 4096x28672 M=320 150.1 / 160.1 / 273.4 / 126.6
# / 159.9, M=384 214.2 / 163.6 / 225.4 / 262.2 / 152.1, M=640 288.4 / 312.9 / 286.6 / 233.3 / 280.7,
# M=768 376.7 / 322.3 / 297.3 / 332.9 / 282.0; 14336x4096 M=320 79.3 / 84.6 / 104.2 / 67.4 / 77.5,
# M=384 111.3 / 84.5 / 99.6 / 122.4 / 78.9, M=640 142.4 / 148.7 / 147.2 / 118.2 / 136.6, M=768 186.1 /
# 153.2 / 151.9 / 172.0 / 139.9: ~3.3 and ~3.9 (k=2 alike); k=5 4096x28672 M=320 174.2 / 186.9 /
# 274.9 / 138.0 / 160.6, M=384 249.4 / 186.1 / 230.9 / 265.8 / 157.9, M=640 340.4 / 361.0 / 309.6 /
# 247.1 / 295.6, M=768 413.8 / 359.5 / 322.4 / 354.3 / 285.5: ~3.0 and ~3.35. (The 320-row tile at
# 3.2: against it, four or five 160-row tiles measured dearer than 1.95 each, M=640 and 768. k=5's
# below 3.0: three 192-row tiles took 273.0 at M=576, two 320-row ones 244.1 at M=640.)
# k=5's 160- to 256-row tiles on a 16-copy table (session 33), µs 8 / 16 copies, 160- / 192- / 256-row
# tiles: 4096x28672 M=160 96.8 / 90.9, M=192 104.2 / 97.6, M=256 122.4 / 117.6, M=512 (256) 218.3 /
# 210.5; 14336x4096 M=160 51.1 / 49.3, M=192 55.3 / 52.2, M=256 64.0 / 62.1, M=512 114.5 / 109.6:
# ~1.8, ~1.9 and ~2.35, and the 320-row tile at 2.8 so that M=513..576 keeps two of them.
# x rows of the dense kbit kernel's tall tiles -> {k: cost in 64-row tiles}.
WGMMA_TALL_TILES: dict[int, dict[int, float]] = {
    160: {2: 1.95, 3: 1.95, 4: 1.95, 5: 1.8},
    192: {2: 2.2, 3: 2.2, 4: 2.2, 5: 1.9},
    256: {2: 2.7, 3: 2.7, 4: 2.7, 5: 2.35},
    320: {2: 3.2, 3: 3.2, 4: 3.2, 5: 2.8},
    384: {2: 3.9, 3: 3.9, 4: 3.9, 5: 3.35},
}
# Layers above these weights (but at most WGMMA_WIDE_ROWS_ABOVE) take the tall tiles but not the
# 128-row one. 4096x4096 k=4 (session 32), µs 64- / 128- / 192-row tiles: M=160 28.5 / 28.6 / 21.7,
# M=192 28.4 / 28.7 / 21.6 (the 128-row tile lost there in session 29).
WGMMA_TALL_ROWS_ABOVE: dict[tuple[int, int], int] = {
    (9, 0): MMA_SMALL_LAYER,
}


def wgmma_tile_cols(rows: int) -> int:
    """Features per row tile of the dense kbit wgmma kernel: two layout tiles, one for the tall tiles
    (past WGMMA_WIDE_ROWS rows, as csrc/kbit_wgmma_tile.cuh's kw_mt)."""
    return 128 if rows > WGMMA_WIDE_ROWS else 256


def wgmma_tall_costs(k: int) -> tuple[tuple[int, float], ...]:
    """(rows, cost in 64-row tiles) of the dense kbit kernel's tall tiles at k bits."""
    return tuple((r, c[k]) for r, c in sorted(WGMMA_TALL_TILES.items()) if k in c)


def wgmma_wide_rows(m: int, tile_cost: float | None, tall: tuple[tuple[int, float], ...] = ()) -> int:
    """x rows per row tile for m rows of a wgmma kernel that also has WGMMA_WIDE_ROWS-row tiles, each
    costing tile_cost 64-row tiles (None: not offered), and the tall (rows, cost) tiles:
    wgmma_tile_rows, or past 64 rows the tile whose ceil(m / rows) tiles cost least, the smaller
    tile on a tie."""
    narrow = WGMMA_ROW_TILES[-1]
    if m <= narrow:
        return wgmma_tile_rows(m)
    wide = [] if tile_cost is None else [(WGMMA_WIDE_ROWS, tile_cost)]
    options = sorted([(narrow, 1.0), *wide, *tall])
    return min(options, key=lambda o: -(-m // o[0]) * o[1])[0]


def wgmma_layer_rows(m: int, capability: tuple[int, int], weights: int, tile_cost: float,
                     above: dict[tuple[int, int], int], taller: tuple[tuple[int, float], ...] = ()) -> int:
    """x rows per row tile of a dense wgmma kernel with wide tiles for m rows of a layer of that many
    weights: wgmma_wide_rows at tile_cost and the taller (rows, cost) tiles on layers above
    above[capability] weights, else wgmma_tile_rows (awq_orin's kernel: awq_ops.wgmma_rows; the kbit
    one, with its tall tiles: wgmma_dense_rows)."""
    first = above.get(capability)
    if first is None or weights <= first:
        return wgmma_tile_rows(m)
    return wgmma_wide_rows(m, tile_cost, taller)


def wgmma_dense_rows(m: int, capability: tuple[int, int], weights: int, k: int) -> int:
    """x rows per row tile of the dense kbit wgmma kernel for m rows of a k-bit layer: wgmma_wide_rows
    at WGMMA_WIDE_TILE_COST[k] and the tall tiles' costs (wgmma_tall_costs) on layers above
    WGMMA_WIDE_ROWS_ABOVE weights, the tall tiles alone above WGMMA_TALL_ROWS_ABOVE, else
    wgmma_tile_rows."""
    wide_first = WGMMA_WIDE_ROWS_ABOVE.get(capability)
    if wide_first is not None and weights > wide_first:
        return wgmma_wide_rows(m, wgmma_wide_tile_cost(k), wgmma_tall_costs(k))
    tall_first = WGMMA_TALL_ROWS_ABOVE.get(capability)
    if tall_first is not None and weights > tall_first:
        return wgmma_wide_rows(m, None, wgmma_tall_costs(k))
    return wgmma_tile_rows(m)


# The grouped wgmma row tile holds the expected rows per expert plus this many square roots of it:
# top-k routing over many experts gives each about a Poisson share, and an expert past its tile
# runs a second one. H200 2026-11-26 session 17, bf16 k=4 Qwen3-30B-A3B shapes (128 experts top-8),
# gate/up µs tile 16 / 32 / 64: 256 tokens (16 rows per expert) 167 / 119 / 134; 512 tokens (32)
# 273 / 179 / 135. seed 002's 8 experts (every token to all 8, no spread) lose 0.3-0.7 µs at 16-32.
GROUPED_TILE_HEADROOM_SIGMAS = 2


# The grouped 128-row tile needs this many stages (64 inputs each) per K split. H200 session 30, awq_orin
# bf16 µs 64- / 128-row tiles: seed 002's 512x2048 (8 stages) at 128 rows per expert (2 splits, 4
# stages each) 8.9 / 17.6, at 256 (no split) 12.5 / 11.0; its 2048x512 at 128 (8 splits) 14.6 / 14.5.
GROUPED_WIDE_MIN_STAGES = 8
# K splits of the grouped wgmma's grids of row tiles up to GROUPED_SHORT_TILE_ROWS at k <= 4: at
# least GROUPED_MIN_SPLIT_STAGES stages each and at most GROUPED_MAX_SPLITS (else: 4 and 16). H200
# session 46 (both kernels and the reduction with PDL), fp16 µs by splits 1 / 2 / 4 / 8, seed 002's
# 512x2048 (8 stages) at 8 tokens (16-row tiles), back to back: kbit k=4 7.63 / 7.39 / 6.61 / 9.85,
# awq 6.94 / 7.07 / 5.87 / 8.94; behind a writer 7.97 / 8.28 / 7.18 / 10.85 and 7.33 / 7.70 / 6.59 /
# 9.64; at 16 tokens (32-row tiles) k=4 8.81 / 8.66 / 7.59, behind a writer 8.92 / 9.68 / 8.31; its
# 2048x512 (32 stages) 8 / 16 splits 7.19 / 7.56, behind a writer 8.13 / 8.65. At 32 and 64 tokens
# (64-row tiles) 512x2048 ran fastest unsplit (k=4 1 / 2 / 4: 9.87 / 11.34 / 10.23 and 12.77 / 15.04
# / 14.73; behind a writer 9.75 / 12.08 / 10.35 and 9.91 / 15.48 / 14.98): there the partials
# outweigh the weights; those tiles keep the rule before (2 splits; k = 5's 32-copy table at one CTA
# per SM counts on it, grouped_wgmma_one_cta). So does k = 5 at every tile: 4 splits move it to the
# 8-copy table at two CTAs per SM, 1-3% slower (512x2048 at 8 tokens 2 / 4 splits 7.39 / 7.61,
# behind a writer 8.13 / 8.06; at 16 8.20 / 8.44, 8.98 / 9.07).
GROUPED_SHORT_TILE_ROWS = 32
GROUPED_MIN_SPLIT_STAGES = 2
GROUPED_MAX_SPLITS = 8
# Larger tiles (64 rows, two CTAs per SM) at k <= 4 split only where an unsplit CTA runs more than
# this many stages: 512x2048 above (8 stages) ran fastest unsplit at 32 and 64 tokens, while its
# 2048x512 (32 stages, 16 unsplit CTAs) needs its splits (awq at 64 tokens 12.6 / 30.2, below).
GROUPED_UNSPLIT_MAX_STAGES = 8


def grouped_wgmma_config(rows: int, n_exp: int, in_f: int, out_f: int, sms: int, bits: int,
                         tile_rows: int | None = None, wide_cost: float | None = None) -> tuple[int, int, int]:
    """(tile_rows, items, splits) of the grouped wgmma kernels (kbit and awq; 256-feature row
    tiles): the row tile that holds the expected rows per active expert (given wide_cost, the
    kernel's cost of a 128-row tile in 64-row tiles: the 128-row tile where wgmma_wide_rows takes it
    for more than 64 expected rows and its grid leaves every K split GROUPED_WIDE_MIN_STAGES
    stages), the grid's work-item bound, and K splits toward two CTAs per SM (one with the 128-row
    tile, never past one wave; GROUPED_MIN_SPLIT_STAGES / GROUPED_MAX_SPLITS bound the splits of
    tiles up to GROUPED_SHORT_TILE_ROWS rows at k <= 4); past half an SM's worth of CTAs only while
    the fp32 partials move at most a quarter of the weight bytes.

    H200 awq (bench_moe.py, µs split / unsplit): seed 002's 2048x512 at 64 tokens, 16 CTAs, 12.6 /
    30.2, at 256 tokens, 64 CTAs, 25.0 / 30.4 (partials 5x the weights, still a win), at 512
    tokens, 128 CTAs, 43.0 / 30.6; its 512x2048 at 256 tokens, 256 CTAs, 36.8 / 13.4; qwen128 gate
    at 8 tokens, 168 CTAs, small partials, 25.0 / 31.3. kbit, session 29, bf16 µs: 64- / 128-row
    tiles, Qwen3 shapes 2048x1536 / 768x2048, k=4 at 64 rows per expert 184 / 191, 109 / 122, at
    128 300 / 284, 163 / 171, at 256 527 / 467, 292 / 283; k=5 at 128 394 / 341, 215 / 200. k=4
    128-row tiles on seed 002's 2048x512: at 256 tokens (32 tiles) 4 splits 18.9, 1 split 32.0
    (64-row tiles 24.2); at 512 tokens (64 tiles) 2 splits 28.8, 1 split 32.0 (64-row tiles 26.9);
    at 1024 tokens (128 tiles) 1 split 32.8, 2 splits 58.8."""
    active = max(1, min(n_exp, rows))
    per = grouped_rows_per_expert(rows, n_exp)
    need = per + GROUPED_TILE_HEADROOM_SIGMAS * math.isqrt(per)
    stages = -(-in_f // 64)

    def grid(r: int) -> tuple[int, int, int]:
        items = (rows + active * (r - 1)) // r
        tiles = active * -(-per // r) * -(-out_f // 256)
        one = r == WGMMA_WIDE_ROWS  # one CTA per SM (128 accumulators a thread): no more than one wave
        target = sms if one else 2 * sms
        if tiles >= target or (bits <= 4 and not one and r > GROUPED_SHORT_TILE_ROWS
                               and stages <= GROUPED_UNSPLIT_MAX_STAGES):
            splits = 1
        elif bits <= 4 and r <= GROUPED_SHORT_TILE_ROWS:
            splits = max(1, min(-(-target // tiles), stages // GROUPED_MIN_SPLIT_STAGES, GROUPED_MAX_SPLITS))
        else:
            splits = max(1, min(target // tiles if one else -(-target // tiles), stages // 4, 16))
        if tiles > sms // 2 and 4 * (splits * rows * out_f * 4) > active * in_f * out_f * bits // 8:
            splits = 1
        return r, items, splits

    if tile_rows:
        return grid(tile_rows)
    narrow = wgmma_tile_rows(need)
    # Past 64 expected rows the wide kernels weigh their tiles by the expected rows, not the headroom:
    # at 64 rows per expert (80 with it) only about half the experts reach a second 64-row tile.
    if wide_cost is None or per <= 64 or wgmma_wide_rows(per, wide_cost) != WGMMA_WIDE_ROWS:
        return grid(narrow)
    r, items, splits = grid(WGMMA_WIDE_ROWS)
    # A one-CTA-per-SM grid whose CTAs run few stages leaves each SM's load latency bare.
    return (r, items, splits) if -(-stages // splits) >= GROUPED_WIDE_MIN_STAGES else grid(narrow)


def grouped_wgmma_one_cta(rows: int, n_exp: int, in_f: int, out_f: int, tile_rows: int, splits: int, sms: int,
                          bits: int) -> bool:
    """k = 5: whether the grouped kbit wgmma kernel looks its pair codes up in the 32-copy table at
    one CTA per SM (no bank conflicts) rather than the 8-copy one at two: where the CTAs expected to
    find work (rows spread evenly over the active experts, K splits as the kernel runs them: none
    empty) fit one per SM. H200 session 28, seed 002's 8 experts, k=5 µs 32-copy / 8-copy: 2048x512
    at 8 / 64 tokens 9.4 / 12.8 against 11.1 / 14.7, 512x2048 8.7 / 13.2 against 11.1 / 16.6; at 256
    tokens (320 CTAs) 2048x512 30.4 against 27.7."""
    if bits != 5:
        return False
    active = max(1, min(n_exp, rows))
    stages = -(-in_f // 64)
    per_split = -(-stages // max(1, splits))
    ctas = -(-out_f // 256) * active * -(-grouped_rows_per_expert(rows, n_exp) // tile_rows) * -(-stages // per_split)
    return ctas <= sms


def choose_path(m: int, capability: tuple[int, int], weights: int | None = None, k: int = 4,
                wgmma: bool = False) -> str:
    """'gemv', 'gemv_tc', 'mma', 'wgmma' or 'dequant' for an activation with m rows of a k-bit layer
    (weights: in x out of the layer; wgmma: whether the Hopper kernels (wgmma, tensor-core GEMV) can
    run here, ops.wgmma_ok outside deterministic mode). The table thresholds assume the MMA variant 5,
    which covers k <= 4 only: k = 5 has its own rules (TC_ROWS_K5, WGMMA_RULES_K5; weights None: a
    large layer) and the GEMV up to GEMV_MAX_M rows where they take none; k = 4 its own tensor-core
    GEMV rows (TC_ROWS_K4)."""
    tc_rows = TC_ROWS_K4 if k == 4 else TC_ROWS if k < 4 else TC_ROWS_K5
    if wgmma and weights is not None and rule_takes(tc_rows.get(capability, ()), weights, m):
        return "gemv_tc"
    if wgmma and k > 4 and rule_takes(WGMMA_RULES_K5.get(capability, ()), 1 << 62 if weights is None else weights, m):
        return "wgmma"
    gemv_max, mma_max = thresholds(capability)
    if m <= (min(gemv_max, GEMV_MAX_M) if k <= 4 else GEMV_MAX_M):
        return "gemv"
    small = weights is not None and weights <= MMA_SMALL_LAYER
    if wgmma and k <= 4 and not small and rule_takes(WGMMA_RULES.get(capability, ()),
                                                     1 << 62 if weights is None else weights, m):
        return "wgmma"
    if wgmma and k <= 4 and small and rule_takes(WGMMA_SMALL_ROWS.get(capability, ()), weights, m):
        return "wgmma"
    return "mma" if m <= mma_max and not (m > MMA_SMALL_LAYER_M and small) else "dequant"


# Rows up to which the "mma" path takes variant 5 for k <= 4 (2 CTAs per SM, x staged in the pair
# table's spare right halves, 16-row tiles up to M = 16). H200 2026-11-21 session 7, k=4 fp16,
# µs v2 / v5: M=8 4096x28672 48.1 / 38.3, 14336x4096 26.5 / 20.4, 4096x6144 15.5 / 11.8,
# 4096x4096 12.8 / 10.0 (M=16 the same within 1 µs, bf16 too); M=32 (32-row tiles) 50.1 / 50.6,
# 27.7 / 26.3, 16.7 / 16.1, 13.6 / 14.0 (summed 108.1 / 107.0).
MMA_V5_MAX_M = 32


def mma_variant(m: int, k: int = 4) -> int:
    """Kernel variant of the "mma" path for m rows of a k-bit layer (0: the default kernel)."""
    if k <= 4 and m <= MMA_V5_MAX_M:
        return 5
    return MMA_VARIANT if m >= MMA_VARIANT_MIN_M else 0


# --- MoE grouped ops (kbit_grouped_linear) ----------------------------------------------------
# Rows of x per expert are only known on the device, so the choice follows the expected rows per
# active expert, ceil(rows / min(experts, rows)), from host-known shapes. GROUPED_GEMV_MAX: the
# largest expected rows per expert served by the grouped GEMV (stream-K, passes of up to 4 rows);
# more go to the grouped MMA. GROUPED_BM: the MMA row tile, the first (largest expected rows per
# expert, tile) entry that covers the rows, else GROUPED_BM_LARGEST.
# H200, benchmarks/bench_moe.py (first run, .device/6): the old slot GEMV lost to the MMA at 4
# rows per expert over 128 experts (qwen128 T=64) and won at 1..4 over 8; the MMA tiles above 16
# were slowed by a serial split-K epilogue, since rewritten (batched partial sums), and bm <= 64
# now decodes each weight once per CTA. Where they were not, bm32 beat bm16 at 16 rows per expert
# (qwen128 T=256: 113 vs 131 us). Tiles are >= ~1.5x the expected rows, so most experts (whose
# rows scatter around the mean) take one tile and decode their weights once; to be re-placed
# from the next run's per-tile table.
GROUPED_GEMV_MAX: dict[tuple[int, int], int] = {
    (9, 0): 4,
}
GROUPED_DEFAULT = 4
# H200 (.device/9, round 2): bm128 lost to bm64 wherever neither split K (256..1024 rows per
# expert: seed8 T=1024 gate 104 vs 101 us, down 145 vs 138; qwen128 T=1024, 64 per expert: gate
# 276 vs 221, down 316 vs 243), so more rows take bm64; bm128 stays reachable for the sweep. The
# split-K sums are now plain partial stores (the L2 reductions cost bm64 41 vs 17 us at seed8 down
# T=64), which moves the split tiles' numbers; to be re-placed from the next run's per-tile table.
GROUPED_BM: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {
    (9, 0): ((8, 16), (20, 32)),
}
GROUPED_BM_DEFAULT = ((8, 16), (20, 32))
GROUPED_BM_LARGEST = 64  # tile for rows per expert past the table
# The slot GEMV (one CTA column per active-expert slot, no prologue) beats the stream-K GEMV when
# little weight is read: H200 (.device/9) seed8 T=1..4 (8 experts x 2048 tile-blocks of 128 x 32
# weights) 6.7 / 7.5 / 8.9 vs 8.6 / 8.8 / 11.4 us (gate), qwen128 T=1 (8 x 384) 8.2 vs 9.6;
# qwen128 T=2 (16 slots, 6144) split (gate 12.9 vs 11.5, down 10.7 vs 11.7). Entry: the most
# slots x n-tiles x K blocks (an upper bound on the tile-blocks read) that take the slot GEMV.
# Session 44, the slot GEMV with PDL and both register groups requested up front (k=4, µs slot /
# stream-K; fp16 x back to back, bf16 x behind a writer): qwen128 T=2 (15 slots, 5760) gate 10.5 /
# 10.3, 13.2 / 12.9; down 9.2 / 9.8, 11.2 / 12.6 (T=1: 6.1 / 8.0, 5.9 / 7.5 back to back).
GROUPED_SLOT_MAX_UNITS: dict[tuple[int, int], int] = {
    (9, 0): 6144,
}
GROUPED_SLOT_MAX_UNITS_DEFAULT = 4096
# k = 5, whose slot GEMV decodes by lane shuffle (its stream-K GEMV by the 32-copy pair table): H200
# session 34, bench_moe.py fp16 µs stream-K / slot (the op then): qwen128 T=1 gate (8 x 6 x 64 = 3072
# units) 9.0 / 10.7, down (3072) 8.6 / 10.3; seed8 T=1 gate (2048) 8.1 / 7.8, down (2048) 7.7 / 7.8.
GROUPED_SLOT_MAX_UNITS_K5 = 2048
# And at most this many K blocks a warp (three of its 4-block load groups, one after another): at
# qwen128 T=2 (session 44, fp16 back to back, µs slot / stream-K) the gate's warps take 16 blocks
# (10.3-10.5 / 9.7-10.3; bf16 behind a writer 13.2 / 12.9), the down projection's 12 (8.8-9.2 /
# 9.8-10.0); 4-8 blocks at T=1 (6.0 / 8.0, 5.6 / 7.4).
GROUPED_SLOT_MAX_WARP_BLOCKS = 12


def grouped_slot_gemv(slots: int, n_tiles: int, nb: int, capability: tuple[int, int], k: int = 4,
                      warp_blocks: int = 0) -> bool:
    """Whether the GEMV path takes the slot GEMV over stream-K: few slots x tiles x blocks, where the
    stream-K prologue (item count, pair table) costs more than its load balance gains (k = 5:
    GROUPED_SLOT_MAX_UNITS_K5), and at most GROUPED_SLOT_MAX_WARP_BLOCKS blocks a slot GEMV warp
    (warp_blocks, from its grid: ops.grouped_gemv_config)."""
    limit = GROUPED_SLOT_MAX_UNITS_K5 if k == 5 else GROUPED_SLOT_MAX_UNITS.get(capability,
                                                                                GROUPED_SLOT_MAX_UNITS_DEFAULT)
    return slots * n_tiles * nb <= limit and warp_blocks <= GROUPED_SLOT_MAX_WARP_BLOCKS


# The fused MoE experts kernel (csrc/kbit_moe_experts.cu) takes a batch of up to this many (token,
# expert) pairs; bigger batches run the five-op path, whose sorted rows share each expert's weights
# and whose GEMMs stage x per CTA. H200 session 35 (bench_moe_experts.py, Qwen3-30B-A3B shapes, k=4,
# bf16), op us one kernel / five ops: 8 pairs 21.0 / 29.0, 16 27.3 / 36.7, 32 38.9 / 44.8, 64 63.7 /
# 63.4.
# The kernel reads an expert's weights once a pair, the five ops once an expert, so it also needs no
# more pairs than experts. Session 44 (the slot GEMV faster), bf16 µs one kernel / five ops: seed8
# (8 experts) 8 pairs 18.4 / 21.0, 16 pairs 23.6 / 23.5, 32 pairs 30.8 / 26.5; qwen128 32 pairs
# 38.8 / 44.6.
MOE_FUSED_MAX_PAIRS = 32


def moe_fused(pairs: int, n_exp: int) -> bool:
    """Whether kbit_moe_experts runs its one-kernel path for a batch of `pairs` (token, expert) pairs
    over n_exp experts."""
    return 0 < pairs <= min(MOE_FUSED_MAX_PAIRS, n_exp) and not deterministic()


def grouped_rows_per_expert(rows: int, n_exp: int) -> int:
    """Expected rows per expert that has any, if routing spreads rows evenly over the experts."""
    active = max(1, min(n_exp, rows))
    return -(-rows // active)


# Rows per pass of the kbit grouped stream-K GEMV. A pass of an expert takes up to this many of its
# rows and one with fewer runs the unit body for its own rows only, so 2 serves the experts that
# uneven routing gives two rows in one pass. H200 2026-11-22 session 13, bench_moe.py k=4 fp16, µs
# at rows per pass 1 / 2 / 3 / 4: qwen128 gate (128 experts) 64 rows 24.7 / 22.6 / 23.5 / 23.5,
# 128 rows 42.5 / 34.5 / 38.1 / 39.7, 256 rows 78.0 / 56.4 / 54.0 / 55.3, 16 rows 10.7 / 11.8 /
# 12.3 / 13.5 (15 experts, one with two rows: the 1-row kernel's three CTAs per SM win), 32 rows
# 15.3 / 15.6 (down 15.9 / 15.3); seed8 gate (8 experts, every row to all 8) 8 rows 8.5 / 7.1 /
# 7.5 / 8.8, 32 rows 11.4 / 9.0 / 10.2 / 11.0, 64 rows 16.7 / 11.2 / 11.7 / 13.0 (4 rows per pass
# costs more than two passes of 2). Session 44 (three bench_moe.py calls, fp16, µs 1 / 2 rows a
# pass): qwen128 32 rows gate 14.0 / 14.5, 13.9 / 14.5, 13.8 / 14.3, down 15.1 / 15.2, 15.1 / 15.1,
# 14.6 / 14.8; 64 rows gate 22.3 / 21.0, 22.2 / 21.1, 21.8 / 20.6.
GSK_ONE_ROW = (16, 33)  # rows in [lo, hi), at most one per expert on average: one row per pass


def grouped_sk_rows(rows: int, n_exp: int) -> int:
    """Rows per pass (1 or 2) of the kbit grouped stream-K GEMV for rows over n_exp experts."""
    lo, hi = GSK_ONE_ROW
    return 1 if rows <= n_exp and lo <= rows < hi else 2


# Expected rows per expert above which bf16 grouped ops dequantize every expert and run torch's
# grouped GEMM (grouped_mm.py). H200 2026-11-21 session 4, bench_moe.py k=4, µs grouped MMA /
# dequant + grouped_mm: qwen128 gate (128 experts 2048x768) at 32 rows per expert 145 / 267, at 64
# 218 / 272 (the dequantize is a fixed ~265 µs: all experts' weights written and read once), so the
# crossover is ~90; seed8 (8 experts 2048x512) already at 64: 44.7 / 24.6. In vLLM, Qwen3-30B-A3B
# shapes, 2048-token prefill went from 0.39x to 0.96x bf16.
GROUPED_DEQUANT_MIN_ROWS = 88
# Against the grouped wgmma kernel (kbit, where it runs) the crossover is far later: session 17, bf16
# k=4, gate/up µs dequant / wgmma: Qwen3 shapes at 128 rows per expert 615 / 326, 256 684 / 554, 512
# 965 / 1146; seed 002's 8 experts at 256 24.0 / 16.0, 512 33.4 / 29.0, 1024 49.0 / 55.4. awq_orin's
# grouped wgmma alike (g128, Qwen3 shapes): 128 rows 617 / 300, 256 689 / 505, 512 963 / 982.
# awq_orin's with its 128-row tiles (session 30, bf16, µs 128-row wgmma / dequant): Qwen3 shapes at 1024
# rows per expert gate/up 1345 / 1522, down 807 / 847; seed 002's 8 experts at 1024 28.3 / 38.1, 38.5
# / 45.4, at 2048 56.8 / 63.8, 75.8 / 76.7, at 4096 122.0 / 119.3, 150.3 / 141.6.
GROUPED_DEQUANT_MIN_ROWS_WGMMA = 2048
# The kbit grouped wgmma with its 128-row tiles (session 29, bf16, µs wgmma / dequant): Qwen3 shapes at
# 512 rows per expert k=4 gate/up 838 / 974, down 506 / 540, k=5 991 / 964, 577 / 537; seed 002's 8
# experts at 512 k=4 27 / 37 (gate, 64-row tiles), 22.5 / 31.8 (down), at 1024 32.8 / 39.2, 43.6 /
# 46.5, k=5 38.0 / 39.6, 50.3 / 47.0, at 2048 67.5 / 62.7, 86.3 / 78.3.
GROUPED_DEQUANT_MIN_ROWS_WGMMA_KBIT = 768


def choose_grouped_path(rows: int, n_exp: int, capability: tuple[int, int]) -> str:
    """'gemv' or 'mma' for a grouped op over rows x rows and n_exp experts (bf16 'mma' calls may
    still go to dequantize + grouped GEMM: grouped_mm.prefers_dequant)."""
    gemv_max = GROUPED_GEMV_MAX.get(capability, GROUPED_DEFAULT)
    return "gemv" if grouped_rows_per_expert(rows, n_exp) <= gemv_max else "mma"


# Where the kbit grouped op takes the Hopper grouped wgmma kernel (ops.wgmma_ok): any (rows per
# expert at least, total rows at least, experts at least) entry met. H200 session 10, bench_moe.py
# k=4 fp16, gate + down µs, op before (GEMV / MMA) -> wgmma: seed8 (8 experts 2048x512 / 512x2048) T=4 (4
# rows per expert) 16.8 -> 20.0, T=8 25.0 -> 20.3, T=16 29.8 -> 21.4, T=64 36.0 -> 30.1, T=512
# 103.5 -> 64.0; qwen128 (128 experts 2048x768 / 768x2048) T=16 (1 row per expert) 85.4 -> 96.2,
# T=64 (4, 512 rows) 163.2 -> 134.8, T=256 (16) 191.2 -> 203.4, T=512 (32) 275.1 -> 215.1, T=1024
# 408.5 -> 250.6.
GROUPED_WGMMA_ROWS: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {(9, 0): ((8, 0, 0), (4, 256, 0))}
# k = 5 (then no stream-K grouped GEMV, whose table decode took k <= 4; the slot GEMV decodes it by
# lane shuffle) had the same entries and one more. H200 2026-11-27 session 26, bench_moe.py k=5 gate + down
# µs, op (slot GEMV) / wgmma, fp16 and bf16: qwen128 T=1 (8 rows) 10.8 / 11.3, 10.4 / 11.6; T=2
# 19.2 / 15.2, 15.4 / 17.8; T=4 (32 rows, 1 per expert) 36.4 / 22.5, 28.0 / 26.3; T=8 66.8 / 44.6,
# 51.9 / 41.1; seed8 (8 experts) T=4 (4 per expert) 10.1 / 11.1, 9.3 / 11.2; T=8 takes it by the k
# <= 4 rule.
# Session 34, with k=5's stream-K grouped GEMV (csrc/kbit_grouped_gemv_sk.cu), fp16 µs stream-K /
# wgmma: qwen128 gate T=4 17.6 / 21.5, T=8 26.2 / 41.2, T=16 40.6 / 49.1; down T=4 18.2 / 24.5, T=8
# 26.7 / 38.6, T=16 41.7 / 49.3; seed8 gate T=8 (8 rows per expert) 12.2 / 9.3, T=4 9.8 / 8.6. So
# k = 5 now takes k <= 4's entries (the 1-row one is gone).
GROUPED_WGMMA_ROWS_K5: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((8, 0, 0), (4, 256, 0)),
}


def grouped_wgmma_rows(rows: int, n_exp: int, capability: tuple[int, int], k: int = 4) -> bool:
    """Whether a k-bit grouped op over rows x rows and n_exp experts has the rows for the grouped
    wgmma kernel (where it can run) on this compute capability (GROUPED_WGMMA_ROWS, k = 5:
    GROUPED_WGMMA_ROWS_K5)."""
    per = grouped_rows_per_expert(rows, n_exp)
    table = GROUPED_WGMMA_ROWS if k <= 4 else GROUPED_WGMMA_ROWS_K5
    return any(per >= p and rows >= r and n_exp >= e for p, r, e in table.get(capability, ()))


def pick_bm(rows_per_expert: int, table: tuple[tuple[int, int], ...], largest: int) -> int:
    """Row tile from a (largest rows per expert, tile) table: the first entry covering the rows, else largest."""
    for limit, bm in table:
        if rows_per_expert <= limit:
            return min(bm, largest)
    return largest


def grouped_bm(rows_per_expert: int, capability: tuple[int, int] = (9, 0)) -> int:
    """Row tile (16, 32, 64, 128) of the kbit grouped MMA for the expected rows per expert."""
    return pick_bm(rows_per_expert, GROUPED_BM.get(capability, GROUPED_BM_DEFAULT), GROUPED_BM_LARGEST)
