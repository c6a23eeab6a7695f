"""CUDA implementations of the awq_orin ops (awq_repack, awq_unrepack, awq_linear).

Resident CUDA layout (see csrc/awq_common.cuh): wq = qweight^T, int32 [out/8, in], AWQ nibble
order kept (it is already the LOP3 pair order); sz [in/group, out, 2] in the activation dtype,
per output pair (s_2p, s_2p+1, b_2p, b_2p+1) with w = q * s + b. Every CUDA tensor uses this
layout. Dispatch by M (rows after flattening) from DISPATCH: the GEMV / small-batch kernels (the
stream-K GEMV for M <= 4 where the layer fills a wave, outside deterministic mode, else the warp
GEMV), the tensor-core MMA kernel (split-K into a torch-allocated fp32 workspace), the Hopper wgmma
kernel (stream-K, sm_90a, outside deterministic mode), or dequantize into a torch buffer + cuBLAS
through torch. awq_grouped_linear (MoE) runs the grouped GEMV or grouped
MMA over all experts in one launch. fp32 activations, or a GPU the library does not serve,
use the same layout through PyTorch math.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from ... import op_checks as C
from ...formats import awq as awq_fmt
from .. import reference as ref
from . import dispatch
from .cargs import SUFFIX
from .cargs import ptr as _ptr
from .grouped_mm import grouped_mm_into, prefers_dequant
from .library import LIB, check, kernels_usable, sm_count
from .ops import aligned16, ck_clusters_cached, wgmma_ok
from .scratch import scratch

# (largest M for the GEMV kernel, largest M for the MMA kernel) per compute capability, from
# benchmarks/bench_awq.py on the H200 (benchmarks/RESULTS.md): the GEMV grows with M, the MMA is
# flat. Since the register-B MMA tile (session 6) the MMA wins from M=5: summed over the four
# Llama-3-8B layers, M=5 warp GEMV 131.7 vs MMA 109.1 us, M=6 142.9 vs 108.7 (seed-002 shapes
# 40.8 vs 37.9 at M=5); the stream-K GEMV keeps M <= 4 (M=4 4096x6144: 11.4 vs 17.8 us).
# dequant + cuBLAS wins past M=64. Other archs use the sm_90 row.
DISPATCH = {90: (4, 64)}
# Where the Hopper wgmma kernel (csrc/awq_wgmma.cu) takes over from the GEMVs, the MMA and
# dequantize + cuBLAS, when it can run (ops.wgmma_ok, outside deterministic mode): per compute
# capability, (layer weights above, first row, last row), the first entry the layer is above wins.
# H200 2026-11-22 session 10 (row tiles of 16 / 32 / 64 x rows), g128 fp16 µs, gemv (stream-K) or
# mma / wgmma:
#   4096x28672 (117 M) M=1 24.7 / 31.1, M=2 30.9 / 29.6, M=8 45.0 / 29.8, M=16 46.9 / 30.0;
#   14336x4096 (59 M) M=2 17.4 / 16.7, M=8 25.1 / 16.8;
#   4096x6144 (25 M) M=2 9.5 / 10.6, M=4 11.4 / 10.5, M=16 14.1 / 10.6, M=48 (op) 17.0 / 17.1;
#   4096x4096 (17 M) M=4 8.5 / 9.6, M=8 11.4 / 9.6, M=48 16.7 / 15.7;
#   2048x5120 M=4 8.0 / 8.0, M=8 10.9 / 8.0, M=32 13.2 (mma), 13.6 (dequant) / 10.0, M=48 13.7
#   (dequant) / 14.6; 2048x512 M=8 7.7 / 4.2, M=32 7.4 (dequant) / 5.5, M=48 7.5 (dequant) / 8.4.
# Session 9 (64-row tiles only): M=64..384 on the Llama-3-8B layers, e.g. 4096x28672 M=384 - /
# 200.2 / 200.9 (dequant), 4096x6144 M=384 50.8 / 44.9 (dequant), 4096x4096 M=256 28.8 / 26.1.
# Session 29 (128-row tiles, WGMMA_WIDE_ROWS_ABOVE), bf16 behind a writer, wgmma / dequantize +
# cuBLAS: 4096x28672 M=512 212.3 / 233.1, M=1024 404.7 / 386.0; 14336x4096 M=512 111.3 / 119.0,
# M=1024 191.0 / 185.7; 4096x6144 M=256 34.9 / 39.2, M=384 45.7 / 45.8. Session 33, with the 160-
# and 192-row tiles (WGMMA_TALL_TILES): 4096x28672 M=768 250.1 / 310.1, M=1024 347.4 / 365.6;
# 14336x4096 M=768 130.0 / 150.0, M=1024 181.0 / 179.7; 4096x6144 M=320 38.6 / 49.6, M=384 43.8 /
# 46.2, M=512 55.9 / 53.3; the op at 14336x4096 M=1024 191.0 / 186.3 (another call). Session 36
# (fp16 behind a writer, `bench_awq.py --behind-writer --extra ...`), wgmma / the op's GEMV: M=3
# 4096x6144 11.0 / 11.7 (tensor core), 4096x4096 9.5 / 10.4 (warp), 4096x8192 12.6 / 13.5, 8192x4096
# 12.9 / 13.6; so 12-48 M layers take it from M=3 (where TC_RULES leave it the rows: M=2 above
# 20 M, M = 2..4 above 40 M go to the tensor-core GEMV). Session 49 (bf16 and fp16 behind a writer,
# the same within 2%), bf16 µs at M = 33 / 48 / 64, mma / dequant / wgmma / wgmma split-K over a
# cluster (WGMMA_CK_RULES): 2048x5120 15.6 / 16.3 / 17.5, 14.2 / 14.0 / 14.3, 13.2 / 13.3 / 13.4,
# 11.3 / 11.4 / 11.4; 5120x2048 15.6 / 16.3 / 16.8, 16.8 / 16.8 / 17.3, 12.6 / 12.7 / 12.9 (split-K
# 13.2); 2048x4096 12.8 / 13.3 / 14.0, 12.8 / 12.3 / 12.9, 11.5 / 11.6 / 11.7, 10.7 / 10.7 / 10.7;
# 4096x2048 mma 12.6 / 13.1 / 13.8, wgmma 11.9 / 12.0 / 12.1; 4096x3072 mma 15.6 / 16.2 / 17.4,
# wgmma 13.3 / 13.3 / 13.3, split-K 12.3 / 12.4 / 12.6; but 2048x512 (1 M) dequant 7.4 / 7.2 / 7.6,
# wgmma 8.2 / 8.3 / 8.5: layers above 4 M take it to M=64.
WGMMA_RULES: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((100 << 20, 2, 1024), (48 << 20, 2, 960), (20 << 20, 3, 384), (12 << 20, 3, 192), (4 << 20, 5, 64),
             (0, 5, 32)),
}
_SUFFIX = SUFFIX


def _kernel_ok(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """fp16/bf16 on a GPU the library serves (kernels_usable warns once, or raises in strict mode)."""
    return dtype in _SUFFIX and kernels_usable(t.device.index)


def awq_repack(qweight, qzeros, scales, group_size, dtype):
    C.check_awq(qweight, qzeros, scales, group_size, "awq_repack")
    groups, out_f = scales.shape
    s = scales.to(torch.float32)
    b = -s * awq_fmt.unpack_awq(qzeros).to(torch.float32)
    sz = torch.cat([s.view(groups, out_f // 2, 2), b.view(groups, out_f // 2, 2)], dim=-1)
    return qweight.t().contiguous(), sz.reshape(groups, out_f, 2).to(dtype).contiguous()


def awq_unrepack(wq, in_features, out_features):
    C.check_awq_unrepack(wq, in_features, out_features)
    C.require(wq.dtype == torch.int32 and tuple(wq.shape) == (out_features // 8, in_features), "awq_unrepack",
              f"CUDA wq must be int32 [{out_features // 8}, {in_features}] (from awq_repack), got "
              f"{wq.dtype} {list(wq.shape)}")
    return wq.t().contiguous()


def _dense(wq: torch.Tensor, sz: torch.Tensor, group_size: int, out_f: int, dtype: torch.dtype) -> torch.Tensor:
    """PyTorch dequantization of the CUDA layout -> W [out, in] (fallback path)."""
    groups = sz.shape[0]
    q = awq_fmt.unpack_awq(wq.t()).to(torch.float32)  # [in, out]
    pairs = sz.reshape(groups, out_f // 2, 2, 2).to(torch.float32)
    s = pairs[:, :, 0, :].reshape(groups, out_f).repeat_interleave(group_size, dim=0)
    b = pairs[:, :, 1, :].reshape(groups, out_f).repeat_interleave(group_size, dim=0)
    return (q * s + b).t().to(dtype)


# Before those, the tensor-core GEMV (csrc/awq_gemv_tc.cu, same conditions as wgmma): (layer weights
# above, first row, last row). H200 2026-11-22 session 11, g128 fp16 µs, gemv_tc (2 units per warp)
# / op before: 4096x28672 (117 M) M=1 24.4 / 24.3, M=2 24.9 / 30.0, M=8 27.8 / 30.1; 14336x4096
# (59 M) M=1 14.4 / 14.2, M=2 15.2 / 16.8, M=8 17.9 / 16.9; 4096x6144 M=2 9.8 / 9.4, M=8 11.6 /
# 10.6. Session 12 (one run, every layer, tc / op before): M=3 2048x5120 6.3 / 7.3, 5120x2048 6.2 /
# 7.7, 2048x4096 5.5 / 6.2, 4096x2048 5.4 / 6.7, 4096x6144 10.1 / 11.0, 4096x4096 7.8 / 8.1; M=4 6.5
# / 9.1, 6.8 / 9.5, 5.9 / 8.0, 5.9 / 7.9, 10.4 / 10.8, 8.6 / 8.6; M=6 mostly loses (5120x2048 8.6 /
# 7.2, 4096x6144 11.0 / 10.7); 2048x512 (1 M) loses at M = 2, 3 (3.9 / 3.0). Session 17, behind a
# kernel without PDL that writes x (as vLLM runs them; `bench_awq.py --behind-writer`), fp16 g128,
# gemv_tc / warp GEMV at M=2: 2048x5120 7.8 / 6.9, 5120x2048 7.9 / 6.2, 2048x4096 7.2 / 6.6,
# 4096x2048 7.4 / 5.5, 4096x4096 9.7 / 9.5, 4096x6144 (25 M) 11.1 / 11.4; M=3 5120x2048 8.6 / 6.9,
# 4096x2048 7.7 / 6.2; M=4 gemv_tc stays best or within 0.3 (2048x5120 8.6 / 9.7, 4096x4096 10.4 /
# 12.0). So M = 2..3 take it only above 20 M weights. Session 36 (fp16 behind a writer), gemv_tc /
# the best other: M=1 4096x28672 26.2 / 27.6 (warp), 4096x20480 (80 M) 20.5 / 22.0 (stream-K), but
# 8192x8192 and 4096x16384 (64 M) 18.1 / 17.7, 17.9 / 17.6 (warp); M = 5..8 at 80 M 22.4 / 23.9,
# 23.9 / 24.2 (wgmma); M = 3..4 on 12-40 M layers the wgmma kernel wins (4096x6144 M=4 12.1 / 11.1,
# 4096x4096 10.3 / 9.5, 4096x8192 14.4 / 12.6; at 48 M, 4096x12288, 16.2 / 16.7), so there the tensor-
# core GEMV keeps M=2 only (4096x6144 10.7 / 10.9) and 12-20 M layers none (an empty row range,
# so that those layers do not fall through to the 4 M rule). Session 39, after the tensor-core GEMV's
# ring went from 4 slots to 2 and the stream-K GEMV's pipeline from 3 stages to 2 (fp16 behind a
# writer, gemv_tc / the best other at M=1): 14336x4096 (59 M) 14.8 / 15.1 (warp), 4096x12288 (50 M)
# 13.3 / 14.8, 8192x8192 16.2 / 17.3, 4096x16384 16.3 / 17.4, but 4096x8192 (34 M) 10.8 / 10.8 and
# 8192x4096 11.1 / 9.7 (warp): M=1 takes it from 40 M.
TC_RULES: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((70 << 20, 1, 8), (40 << 20, 1, 4), (20 << 20, 2, 2), (12 << 20, 1, 0), (4 << 20, 4, 4)),
}


# Layers of at most this many weights take dequantize + cuBLAS from this row on, where DISPATCH would
# run the MMA (per compute capability: (weights at most, first row)). H200 2026-11-30 session 49, g128
# bf16 behind a writer of x, µs at M = 33 / 48 / 64 mma / dequant / wgmma: 2048x512 10.1 / 11.2 /
# 11.3, 7.6 / 7.6 / 7.2, 8.3 / 8.1 / 8.3; 512x2048 9.3-9.8, 5.2-5.3, 7.9-8.1; 1024x1024 10.8-11.7,
# 5.9-6.2, 8.1-8.5; 2048x2048 12.3-12.8, 9.9-10.2, 10.6-10.8; 1024x4096 12.5-13.3, 8.3-8.7, 10.4-10.5;
# but 2048x4096 (8 M) dequant 12.3-12.9 against wgmma split-K 10.7 (WGMMA_RULES, WGMMA_CK_RULES).
DEQUANT_FROM: dict[tuple[int, int], tuple[int, int]] = {
    (9, 0): (4 << 20, 33),
}


def choose_path(m: int, capability: tuple[int, int], wgmma: bool = False, weights: int = 0) -> str:
    """'gemv', 'gemv_tc', 'mma', 'wgmma' or 'dequant' for an activation with m rows of a layer of
    `weights` (in x out) weights (wgmma: whether the Hopper kernels (wgmma, tensor-core GEMV) can
    run here, wgmma_ok outside deterministic mode; weights 0: unknown)."""
    if wgmma:
        if dispatch.rule_takes(TC_RULES.get(capability, ()), weights, m):
            return "gemv_tc"
        if dispatch.rule_takes(WGMMA_RULES.get(capability, ()), weights, m):
            return "wgmma"
    gemv_max, mma_max = DISPATCH.get(capability[0] * 10 + capability[1], DISPATCH[90])
    if 0 < m <= gemv_max:
        return "gemv"
    small = DEQUANT_FROM.get(capability)
    if small is not None and 0 < weights <= small[0] and m >= small[1]:
        return "dequant"
    return "mma" if 0 < m <= mma_max else "dequant"


# Stream-K GEMV (csrc/awq_gemv_sk.cu): a work unit is one 8-output column group x 512 inputs (4096
# weights, as a kbit unit), split evenly over the warps of one wave of CTAs.
SK_WARPS = 8  # warps per CTA
SK_MAX_M = 4  # instantiated for M = 1..4
SK_UNIT_INPUTS = 512
# M -> units per warp of a full wave at least for the auto "gemv" path to take stream-K; below, the
# warp GEMV runs. H200 2026-11-21 session 5 (both launched with PDL), fp16 group 128, stream-K /
# warp µs: M=1 gateup 24.5/29.5 (9 units per warp), down 14.6/14.3 (4.5), qkv 8.4/8.6 (1.9),
# o 7.2/5.4 (1.3); M=2 gateup 30.7/36.4, down 17.6/21.3, qkv 9.4/10.4, o 8.3/8.6. Session 3, M=4:
# gateup 40.6/51.4, down 24.0/33.5, qkv 14.0/15.7 (2.9), o 11.1/11.8 (1.9), 2048x5120 10.0/9.6 (1.2).
# Session 17, behind a writer of x (fp16, µs stream-K / warp): M=2 4096x4096 (1.9) 11.0 / 9.5,
# 4096x6144 (2.9) 12.4 / 11.4; M=3 4096x4096 10.8 / 10.0: M = 2..3 take stream-K from 3 units per warp.
SK_MIN_UNITS: dict[int, float] = {1: 6.0, 2: 3.0, 3: 3.0, 4: 1.5}
_SK_OCC: dict[tuple[int, int, str], int] = {}


def gemv_sk_units(in_f: int, out_f: int) -> int:
    """(column group, 512-input chunk) work units of the stream-K GEMV."""
    return (out_f // 8) * -(-in_f // SK_UNIT_INPUTS)


def gemv_sk_ctas(dev: torch.device, suffix: str, m: int, in_f: int, out_f: int, forced: bool = False) -> int:
    """One wave of the stream-K GEMV (resident CTAs per SM x SMs); 0 where the warp GEMV is used
    instead (M > 4, or fewer than SK_MIN_UNITS[M] units per warp of a wave). forced: any grid with
    >= 1 unit per warp (tests, benchmarks); 0 when even one CTA has too few."""
    if not 0 < m <= SK_MAX_M:
        return 0
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), m, suffix)
    if key not in _SK_OCC:
        occ = int(getattr(LIB, f"kbit_vllm_awq_gemv_sk_ctas_per_sm_{suffix}")(ctypes.c_int(m)))
        if occ <= 0:
            raise RuntimeError(f"awq stream-K GEMV (M={m}, {suffix}) cannot be resident on this GPU")
        _SK_OCC[key] = occ
    return dispatch.stream_k_grid(_SK_OCC[key] * sm_count(dev), gemv_sk_units(in_f, out_f), SK_WARPS,
                                  SK_MIN_UNITS.get(m), forced)


# Tensor-core GEMV (csrc/awq_gemv_tc.cu, Hopper): a work unit is 64 outputs x 64 inputs, split
# evenly over the warps of one wave of CTAs; M <= 8 (x rows are the mma's 8 columns).
TC_WARPS = 8
TC_MAX_M = 8
TC_COLS = 64
TC_INPUTS = 64
# Units per warp at least: a smaller grid where the layer is small, as each warp's first units wait
# out the whole load latency and a tile split over many warps costs each of them a reduction.
TC_MIN_UNITS = 2
_TC_OCC: dict[tuple[int, str], int] = {}


def gemv_tc_units(in_f: int, out_f: int) -> int:
    """(64-output tile, 64-input stage) work units of the tensor-core GEMV."""
    return -(-out_f // TC_COLS) * -(-in_f // TC_INPUTS)


def gemv_tc_ctas(dev: torch.device, suffix: str, m: int, in_f: int, out_f: int) -> int:
    """CTAs of the tensor-core GEMV: one wave (resident CTAs per SM x SMs) or fewer, so that each
    warp has TC_MIN_UNITS units where the layer allows; 0 where it cannot run (M > 8, not Hopper /
    sm_90a, or fewer units than one CTA's warps)."""
    if not 0 < m <= TC_MAX_M or not wgmma_ok(dev, 4):
        return 0
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), suffix)
    if key not in _TC_OCC:
        _TC_OCC[key] = max(0, int(getattr(LIB, f"kbit_vllm_awq_gemv_tc_ctas_per_sm_{suffix}")()))
    units = gemv_tc_units(in_f, out_f)
    if units < TC_WARPS:
        return 0
    return min(_TC_OCC[key] * sm_count(dev), max(1, units // (TC_WARPS * TC_MIN_UNITS)))


# Tile of the Hopper kernel (csrc/awq_wgmma.cu): a stream-K unit is one row tile (WGMMA_TILE_COLS
# outputs x wgmma_rows(m) rows of x) x WGMMA_STAGE_INPUTS inputs.
WGMMA_TILE_COLS = 256
WGMMA_STAGE_INPUTS = 64
_WG_OCC: dict[tuple[int, str, int], int] = {}
# Layers (weights at most, first row) on which the wgmma kernel runs one CTA per SM instead of a
# full wave of two (the kbit kernel's dispatch.WGMMA_ONE_CTA, measured for awq_orin); every grid is
# then shrunk to an even split of the row tiles where one is near (dispatch.wgmma_even_grid). H200
# 2026-11-27 session 28, g128 bf16 behind a writer of x, µs at 128 / 132 / 256 / 264 CTAs:
# 4096x4096 M=16 9.0 / 10.4 / 9.8 / 10.5, M=32 11.5 / 12.2 / 12.4 / 13.4, M=64 14.5 / 16.2 / 17.2 /
# 19.7; 4096x6144 M=16 13.1 / 12.6 / 12.5 / 11.1, M=32 15.3 / 14.7 / 15.7 / 13.5, M=64 18.5 / 17.5
# / 21.1 / 19.1; 14336x4096 M=16 20.9 / 21.7 / 18.3 / 19.0, M=64 28.9 / 29.5 / 27.7 / 28.9.
WGMMA_ONE_CTA: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {
    (9, 0): ((17 << 20, 16), (26 << 20, 33)),
}


# The dense wgmma kernel's 128-row tile (csrc/awq_wgmma.cu, one CTA per SM): past 64 rows, on layers
# above WGMMA_WIDE_ROWS_ABOVE weights, where its tiles at WGMMA_WIDE_TILE_COST 64-row tiles each cost
# less (dispatch.wgmma_wide_rows). H200 2026-11-27 session 29, g128 bf16 behind a writer, µs 64- /
# 128-row tiles: 4096x28672 M=128 76.2 / 71.7, M=192 107.0 / 124.1, M=256 139.6 / 125.9, M=384
# 197.1 / 166.6, M=512 260.1 / 212.3; 14336x4096 M=128 42.6 / 37.8, M=256 71.2 / 61.9, M=384 104.4 /
# 87.6; 4096x6144 M=128 25.8 / 24.4, M=256 42.6 / 34.9; but 4096x4096 M=128 19.4 / 21.0.
WGMMA_WIDE_ROWS_ABOVE: dict[tuple[int, int], int] = {
    (9, 0): 20 << 20,
}
WGMMA_WIDE_TILE_COST = 1.6
# Taller row tiles of the same kernel on the same layers (m64n160k16 / m64n192k16 on both m64 tiles,
# 160 / 192 accumulators a thread, 222 / 248 registers, one CTA per SM): one dequant for 160 or 192
# rows. Rows -> cost in 64-row tiles. H200 2026-11-28 session 33, g128 bf16 behind a writer, µs 128- /
# 160- / 192-row tiles: 4096x28672 M=160 114.8 / 72.7 / 80.6, M=192 115.0 / 122.0 / 82.5, M=256 114.8
# / 121.8 / 135.6, M=320 157.0 / 124.6 / 136.5, M=384 158.0 / 166.2 / 142.3, M=512 203.1 / 214.2 /
# 187.3, M=768 291.4 / 265.4 / 250.1; 14336x4096 M=160 61.0 / 41.8 / 46.4, M=320 84.5 / 66.2 / 72.8,
# M=384 85.0 / 90.4 / 75.1, M=768 152.6 / 139.2 / 130.0; 4096x6144 M=160 35.0 / 27.4 / 31.4, M=320
# 45.6 / 38.6 / 43.4 (cuBLAS bf16 at M=160: 76.6, 45.8, 19.5).
WGMMA_TALL_TILES: dict[int, float] = {160: 1.9, 192: 2.1}


def wgmma_rows(m: int, capability: tuple[int, int], weights: int) -> int:
    """x rows per row tile of the dense awq wgmma kernel for m rows of a layer of that many weights
    (dispatch.wgmma_layer_rows with this kernel's WGMMA_WIDE_TILE_COST, WGMMA_TALL_TILES and
    WGMMA_WIDE_ROWS_ABOVE)."""
    return dispatch.wgmma_layer_rows(m, capability, weights, WGMMA_WIDE_TILE_COST, WGMMA_WIDE_ROWS_ABOVE,
                                     tuple(sorted(WGMMA_TALL_TILES.items())))


def wgmma_config(dev: torch.device, suffix: str, m: int, in_f: int, out_f: int) -> tuple[int, int, int]:
    """(rows, ctas, row_tiles) of the wgmma kernel: its row tile height (wgmma_rows), one wave
    (resident CTAs per SM x SMs; one per SM on the small layers of WGMMA_ONE_CTA and with the 128-row
    tile; a little smaller where that splits the row tiles evenly, dispatch.wgmma_even_grid), never
    more than its (row tile, stage) units."""
    rows = wgmma_rows(m, torch.cuda.get_device_capability(dev), in_f * out_f)
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), suffix, rows)
    if key not in _WG_OCC:
        _WG_OCC[key] = int(getattr(LIB, f"kbit_vllm_awq_wgmma_ctas_per_sm_{suffix}")(ctypes.c_int(rows)))
    if _WG_OCC[key] <= 0:
        raise RuntimeError(f"awq wgmma kernel ({suffix}, {rows} rows) cannot be resident on this GPU")
    row_tiles = -(-out_f // WGMMA_TILE_COLS) * -(-m // rows)
    stages = -(-in_f // WGMMA_STAGE_INPUTS)
    units = row_tiles * stages
    one = dispatch.wgmma_one_cta(torch.cuda.get_device_capability(dev), in_f * out_f, m, WGMMA_ONE_CTA)
    per_sm = 1 if one else _WG_OCC[key]
    return rows, dispatch.wgmma_even_grid(units, stages, min(per_sm * sm_count(dev), units)), row_tiles


# Split-K over a cluster (csrc/awq_wgmma.cu with splits > 0, csrc/wgmma_cluster.cuh): each row tile's
# stages split evenly over a cluster of CTAs, one an SM, whose sums meet in distributed shared memory,
# for row tiles of at most WGMMA_CK_MAX_ROWS rows; awq_linear takes it where WGMMA_CK_RULES (weights
# at most, first row, last row) and the grid's fill (dispatch.WGMMA_CK_MIN_FILL) ask. H200 2026-11-30
# session 49, g128 bf16 behind a writer, µs wgmma split-K / stream-K at M = 33 / 48 / 64: 2048x5120
# 11.3 / 11.4 / 11.4 against 13.2 / 13.3 / 13.4, 2048x4096 10.7 against 11.5-11.7, 4096x3072 12.3-12.6
# against 13.3, 4096x4096 14.2 / 14.1 / 14.1 against 14.5 / 14.5 / 14.6, 4096x6144 M=48 / 64 17.4 /
# 17.4 against 17.9 / 18.0; fp16 alike; M = 16..32 lose (4096x6144 M=16 14.1 / 11.4), and so do the
# layers whose clusters fill half the SMs (5120x2048: 8 row tiles of 8 CTAs, 13.2 against 12.8).
WGMMA_CK_MAX_ROWS = dispatch.WGMMA_CK_MAX_ROWS
WGMMA_CK_RULES: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (9, 0): ((26 << 20, 33, 64),),
}


def wgmma_ck_clusters(dev: torch.device, suffix: str, rows: int, splits: int) -> int:
    """Clusters of `splits` CTAs of the wgmma kernel (rows-row tiles) resident at once on dev (one
    CTA an SM: the SMs for splits = 1); 0 where none fits."""
    return ck_clusters_cached(dev, ("awq", suffix, rows), splits, lambda: getattr(
        LIB, f"kbit_vllm_awq_wgmma_ck_clusters_{suffix}")(ctypes.c_int(rows), ctypes.c_int(splits)))


def wgmma_ck_config(dev: torch.device, suffix: str, m: int, in_f: int, out_f: int,
                    splits: int | None = None) -> tuple[int, int, int] | None:
    """(rows, splits, row_tiles) of the split-K wgmma launch: the stream-K launch's row tile height
    (wgmma_rows) and, unless given, dispatch.wgmma_ck_splits' cluster size; None where the row tile is
    taller than WGMMA_CK_MAX_ROWS or no size fits one wave."""
    rows = wgmma_rows(m, torch.cuda.get_device_capability(dev), in_f * out_f)
    if rows > WGMMA_CK_MAX_ROWS:
        return None
    row_tiles = -(-out_f // WGMMA_TILE_COLS) * -(-m // rows)
    if splits is None:
        splits = dispatch.wgmma_ck_splits(row_tiles, -(-in_f // WGMMA_STAGE_INPUTS),
                                          lambda s: wgmma_ck_clusters(dev, suffix, rows, s))
    return None if splits is None else (rows, splits, row_tiles)


def wgmma_ck_wanted(dev: torch.device, suffix: str, m: int, in_f: int, out_f: int) -> bool:
    """Whether awq_linear's wgmma launch splits K over clusters: the layer and m under
    WGMMA_CK_RULES and a grid of at least dispatch.WGMMA_CK_MIN_FILL of the SMs."""
    if not dispatch.wgmma_ck_rule(torch.cuda.get_device_capability(dev), in_f * out_f, m, WGMMA_CK_RULES):
        return False
    return dispatch.wgmma_ck_fills(wgmma_ck_config(dev, suffix, m, in_f, out_f), sm_count(dev))


def linear_path(x2: torch.Tensor, wq: torch.Tensor, sz: torch.Tensor, bias: torch.Tensor | None,
                group_size: int, out_features: int, path: str) -> torch.Tensor:
    """y [m, out] = x2 [m, in] @ W^T + bias through one named kernel path (benchmarks call it too).

    "gemv" is the stream-K GEMV for M <= 4 where the layer has enough units for a full wave (outside
    deterministic mode), else the warp GEMV; "gemv_sk" and "gemv_warp" name one of them, "gemv_tc" the
    Hopper tensor-core GEMV (M <= 8). "mma" is
    the tensor-core kernel, "wgmma" the Hopper one (wgmma_ok), "wgmma_ck" the same split-K over clusters
    (wgmma_ck_config; "wgmma_ck1".."wgmma_ck8" at that cluster size), "dequant" dequantize + cuBLAS.
    """
    m, in_f = x2.shape
    dev = x2.device
    suffix = _SUFFIX[x2.dtype]
    stream = ctypes.c_void_p(torch.cuda.current_stream(dev).cuda_stream)
    dims = (ctypes.c_int(in_f), ctypes.c_int(out_features), ctypes.c_int(group_size), stream)
    with torch.cuda.device(dev):
        if path == "dequant":
            w = torch.empty((out_features, in_f), dtype=x2.dtype, device=dev)
            check(getattr(LIB, f"kbit_vllm_awq_dequant_{suffix}")(_ptr(wq), _ptr(sz), _ptr(w), *dims[:3],
                                                                  ctypes.c_int(1), stream), "awq_dequant")
            return F.linear(x2, w, bias)
        y = torch.empty((m, out_features), dtype=x2.dtype, device=dev)
        if m == 0:
            return y
        use_sk = (path == "gemv" and not dispatch.deterministic()) or path == "gemv_sk"
        ctas = gemv_sk_ctas(dev, suffix, m, in_f, out_features, forced=path == "gemv_sk") if use_sk else 0
        if path == "gemv_sk" and ctas == 0:
            raise ValueError(f"awq_linear gemv_sk path takes M <= {SK_MAX_M} and >= {SK_WARPS} work units, got "
                             f"M={m}, units={gemv_sk_units(in_f, out_features)}")
        if ctas > 0:
            acc = scratch(dev, "accum", out_features * m)
            ctr = scratch(dev, "counters", out_features // 8)
            check(getattr(LIB, f"kbit_vllm_awq_gemv_sk_{suffix}")(
                _ptr(x2), _ptr(wq), _ptr(sz), _ptr(bias), _ptr(y), ctypes.c_int(m), *dims[:3], ctypes.c_int(ctas),
                _ptr(acc), _ptr(ctr), stream), "awq_gemv (stream-K)")
        elif path == "gemv_tc":
            ctas = gemv_tc_ctas(dev, suffix, m, in_f, out_features)
            if ctas == 0:
                raise ValueError(f"awq_linear gemv_tc path takes M <= {TC_MAX_M} and >= {TC_WARPS} work units on "
                                 f"compute capability 9.0 with an sm_90a library, got M={m}, units="
                                 f"{gemv_tc_units(in_f, out_features)}, capability "
                                 f"{torch.cuda.get_device_capability(dev)}")
            acc = scratch(dev, "accum", out_features * m)
            ctr = scratch(dev, "counters", -(-out_features // TC_COLS))
            check(getattr(LIB, f"kbit_vllm_awq_gemv_tc_{suffix}")(
                _ptr(x2), _ptr(wq), _ptr(sz), _ptr(bias), _ptr(y), ctypes.c_int(m), *dims[:3], ctypes.c_int(ctas),
                _ptr(acc), _ptr(ctr), stream), "awq_gemv (tensor-core)")
        elif path in ("gemv", "gemv_warp"):
            check(getattr(LIB, f"kbit_vllm_awq_gemv_{suffix}")(
                _ptr(x2), _ptr(wq), _ptr(sz), _ptr(bias), _ptr(y), ctypes.c_int(m), *dims), "awq_gemv")
        elif path == "wgmma":
            if not wgmma_ok(dev, 4):
                raise ValueError(f"awq_linear wgmma path needs compute capability 9.0 and a library built for "
                                 f"sm_90a, got {torch.cuda.get_device_capability(dev)}")
            rows, ctas, row_tiles = wgmma_config(dev, suffix, m, in_f, out_features)
            # Partial row tiles: a zeroed fp32 accumulator per row tile and a counter (both left zeroed).
            ws = scratch(dev, "accum", row_tiles * rows * WGMMA_TILE_COLS)
            ctr = scratch(dev, "counters", row_tiles)
            check(getattr(LIB, f"kbit_vllm_awq_wgmma_{suffix}")(
                _ptr(x2), _ptr(wq), _ptr(sz), _ptr(bias), _ptr(y), ctypes.c_int(m), *dims[:3], ctypes.c_int(rows),
                ctypes.c_int(ctas), _ptr(ws), _ptr(ctr), stream), "awq_linear (wgmma)")
        elif path.startswith("wgmma_ck"):
            forced = dispatch.wgmma_ck_path_splits(path, "awq_linear")
            if not wgmma_ok(dev, 4):
                raise ValueError(f"awq_linear {path!r} path needs compute capability 9.0 and a library built for "
                                 f"sm_90a, got {torch.cuda.get_device_capability(dev)}")
            rows, splits, row_tiles = dispatch.wgmma_ck_launch(
                wgmma_ck_config(dev, suffix, m, in_f, out_features, forced), -(-in_f // WGMMA_STAGE_INPUTS),
                "awq_linear", path, f"M={m}, in={in_f}, out={out_features}", WGMMA_CK_MAX_ROWS)
            check(getattr(LIB, f"kbit_vllm_awq_wgmma_ck_{suffix}")(
                _ptr(x2), _ptr(wq), _ptr(sz), _ptr(bias), _ptr(y), ctypes.c_int(m), *dims[:3], ctypes.c_int(rows),
                ctypes.c_int(splits), ctypes.c_int(row_tiles * splits), stream), "awq_linear (wgmma_ck)")
        elif path == "mma":
            splits = int(LIB.kbit_vllm_awq_mma_splits(ctypes.c_int(m), ctypes.c_int(in_f), ctypes.c_int(out_features)))
            ws = torch.empty((splits * m * out_features if splits > 1 else 0,), dtype=torch.float32, device=x2.device)
            check(getattr(LIB, f"kbit_vllm_awq_mma_{suffix}")(
                _ptr(x2), _ptr(wq), _ptr(sz), _ptr(bias), _ptr(y), _ptr(ws if splits > 1 else None),
                ctypes.c_int(splits), ctypes.c_int(m), *dims), "awq_mma")
        else:
            raise ValueError(f"unknown awq_linear path {path!r}")
        return y


def awq_linear(x, wq, sz, bias, group_size, out_features):
    C.check_awq_linear(x, wq, sz, bias, group_size, out_features)
    in_f = sz.shape[0] * group_size
    C.require(wq.dtype == torch.int32 and tuple(wq.shape) == (out_features // 8, in_f), "awq_linear",
              f"CUDA wq must be int32 [{out_features // 8}, {in_f}] (from awq_repack), got "
              f"{wq.dtype} {list(wq.shape)}")
    if not _kernel_ok(x, x.dtype):
        return F.linear(x, _dense(wq, sz, group_size, out_features, x.dtype), bias)
    x2 = x.reshape(-1, in_f)
    x2 = aligned16(x2)
    wgmma = not dispatch.deterministic() and wgmma_ok(x.device, 4)
    path = choose_path(x2.shape[0], torch.cuda.get_device_capability(x.device), wgmma, in_f * out_features)
    if path == "wgmma" and wgmma_ck_wanted(x.device, _SUFFIX[x2.dtype], x2.shape[0], in_f, out_features):
        path = "wgmma_ck"
    y = linear_path(x2, aligned16(wq), aligned16(sz), bias.contiguous() if bias is not None else None, group_size,
                    out_features, path)
    return y.reshape(*x.shape[:-1], out_features)


# --- MoE: awq_grouped_linear --------------------------------------------------------------------
# One launch covers every expert; the kernels read expert_offsets on the device, and grid sizes
# come from host-known shapes only (graph-capturable, no host sync). The choice follows the
# expected rows per active expert (kbit's dispatch.grouped_rows_per_expert): the grouped GEMV up to
# GROUPED_GEMV_MAX rows, else the grouped MMA with the row tile of GROUPED_BM ((largest rows per
# expert, tile) entries; more rows take 64). H200, bench_moe.py per-tile table (.device/6): GEMV
# best to 4 rows per expert (seed8 T=8: mma bm16 11.7 vs gemv 16.3 us); bm16 to 8 rows, bm32 at 16
# (qwen128 T=256: 98 vs 139 / 151 us), bm64 from 32 (qwen128 T=512: 151 vs 156, 134 vs 137 us).
# H200 round 2 (.device/9): the slot GEMV loses at 4 rows per expert when many experts have rows
# (qwen128 T=64, 512 rows over 126 experts: gemv 137 / 151 us vs mma bm16 79 / 86, gate / down)
# and wins there with few (seed8 T=4, 32 rows: 9.9 / 9.7 vs 11.5 / 10.2), so up to 2 rows per
# expert always take the GEMV, 3..4 only within 64 rows in all (GROUPED_GEMV_FEW).
# Where the Hopper grouped wgmma kernel runs (ops.wgmma_ok), it takes every call the dequantize +
# grouped GEMM rule leaves: H200 session 10, bench_moe.py, µs, op before (GEMV / MMA) -> wgmma,
# qwen128 gate / down: T=1 10.7 / 8.8 -> 8.7 / 8.9, T=8 36.8 / 39.2 -> 25.0 / 25.3, T=64 73.9 / 70.8
# -> 43.7 / 46.4, T=512 114.0 / 116.8 -> 91.2 / 80.0, T=1024 168.6 / 168.0 -> 112.3 / 102.2; seed8
# gate T=1 7.1 -> 7.3, T=8 9.2 -> 8.3, T=1024 73.8 -> 65.0.
GROUPED_GEMV_MAX = {90: 2}
GROUPED_GEMV_FEW = {90: (4, 64)}  # (rows per expert, total rows) still served by the GEMV
GROUPED_BM = {90: ((8, 16), (16, 32))}


def grouped_gemv_ok(rows: int, n_exp: int, cc: int = 90) -> bool:
    """Whether awq_grouped_linear takes the slot GEMV (else the grouped MMA): few rows per expert,
    since each expert's rows go in passes that re-read its weights."""
    per = dispatch.grouped_rows_per_expert(rows, n_exp)
    few_per, few_rows = GROUPED_GEMV_FEW.get(cc, GROUPED_GEMV_FEW[90])
    return per <= GROUPED_GEMV_MAX.get(cc, GROUPED_GEMV_MAX[90]) or (per <= few_per and rows <= few_rows)


def grouped_mma_config(rows: int, n_exp: int, in_f: int, out_f: int, sms: int,
                       bm: int | None = None, cc: int = 90) -> tuple[int, int, int]:
    """(bm, items, splits): row tile, the grid's work-item bound, K splits for ~2 waves of CTAs
    (cc: compute capability as 10 * major + minor, for the row-tile table)."""
    active = max(1, min(n_exp, rows))
    per = dispatch.grouped_rows_per_expert(rows, n_exp)
    bm = bm or dispatch.pick_bm(per, GROUPED_BM.get(cc, GROUPED_BM[90]), 64)
    items = (rows + active * (bm - 1)) // bm
    tiles = active * -(-per // bm) * ((out_f + 127) // 128)
    k_tiles = in_f // 32
    splits = max(1, min(-(-2 * sms // tiles), k_tiles // 4, 16)) if tiles <= sms else 1
    return bm, items, splits


def grouped_wgmma_config(rows: int, n_exp: int, in_f: int, out_f: int, sms: int,
                         tile_rows: int | None = None) -> tuple[int, int, int]:
    """(tile_rows, items, splits) of the grouped wgmma kernel (dispatch.grouped_wgmma_config, 4-bit
    weights, its 128-row tile at the dense kernel's WGMMA_WIDE_TILE_COST)."""
    return dispatch.grouped_wgmma_config(rows, n_exp, in_f, out_f, sms, 4, tile_rows,
                                         wide_cost=WGMMA_WIDE_TILE_COST)


def grouped_path(x2: torch.Tensor, wq: torch.Tensor, sz: torch.Tensor, offsets: torch.Tensor, group_size: int,
                 out_features: int, path: str, bm: int | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """y [rows, out] for a contiguous 2-D fp16/bf16 x (rows sorted by expert) through one kernel.

    wq [E, out/8, in] int32, sz [E, in/group, out, 2], offsets int32 [E + 1] on the device. Public
    so tests and benchmarks can run every path; out, if given, receives the result. bm: the row
    tile of "mma" (16, 32, 64) or "wgmma" (the Hopper kernel's wgmma N: 16, 32, 64, 128).
    """
    rows, in_f = x2.shape
    n_exp = wq.shape[0]
    suffix = _SUFFIX[x2.dtype]
    if out is None and not (path == "dequant" and rows > 0):  # torch's grouped GEMM allocates its own output
        out = torch.empty((rows, out_features), dtype=x2.dtype, device=x2.device)
    y = out
    if rows == 0:
        return y
    slots = min(n_exp, rows)
    stream = ctypes.c_void_p(torch.cuda.current_stream(x2.device).cuda_stream)
    dims = (ctypes.c_int(n_exp), ctypes.c_int(rows), ctypes.c_int(in_f), ctypes.c_int(out_features),
            ctypes.c_int(group_size))
    with torch.cuda.device(x2.device):
        if path == "gemv":
            check(getattr(LIB, f"kbit_vllm_awq_grouped_gemv_{suffix}")(
                _ptr(x2), _ptr(wq), _ptr(sz), _ptr(offsets), _ptr(y), *dims, ctypes.c_int(slots), stream),
                "awq_grouped_linear (gemv)")
            return y
        if path == "dequant":  # every expert dequantized in one launch, then torch's grouped GEMM
            w = torch.empty((n_exp, out_features, in_f), dtype=x2.dtype, device=x2.device)
            check(getattr(LIB, f"kbit_vllm_awq_dequant_{suffix}")(
                _ptr(wq), _ptr(sz), _ptr(w), *dims[2:], ctypes.c_int(n_exp), stream), "awq_grouped_linear (dequant)")
            return grouped_mm_into(x2, w, offsets, out)
        if path == "wgmma":
            if not wgmma_ok(x2.device, 4):
                raise ValueError(f"awq_grouped_linear wgmma path needs compute capability 9.0 and a library built "
                                 f"for sm_90a, got {torch.cuda.get_device_capability(x2.device)}")
            r, items, splits = grouped_wgmma_config(rows, n_exp, in_f, out_features, sm_count(x2.device), bm)
            ws = torch.empty((splits * rows * out_features if splits > 1 else 0,), dtype=torch.float32,
                             device=x2.device)
            check(getattr(LIB, f"kbit_vllm_awq_grouped_wgmma_{suffix}")(
                _ptr(x2), _ptr(wq), _ptr(sz), _ptr(offsets), _ptr(y), _ptr(ws if splits > 1 else None), *dims,
                ctypes.c_int(r), ctypes.c_int(items), ctypes.c_int(splits), stream), "awq_grouped_linear (wgmma)")
            return y
        if path != "mma":
            raise ValueError(f"unknown awq_grouped_linear path {path!r}")
        cap = torch.cuda.get_device_capability(x2.device)
        bm, items, splits = grouped_mma_config(rows, n_exp, in_f, out_features, sm_count(x2.device), bm,
                                               cap[0] * 10 + cap[1])
        ws = torch.empty((splits * rows * out_features if splits > 1 else 0,), dtype=torch.float32, device=x2.device)
        check(getattr(LIB, f"kbit_vllm_awq_grouped_mma_{suffix}")(
            _ptr(x2), _ptr(wq), _ptr(sz), _ptr(offsets), _ptr(y), _ptr(ws if splits > 1 else None), *dims,
            ctypes.c_int(bm), ctypes.c_int(items), ctypes.c_int(splits), stream), "awq_grouped_linear (mma)")
    return y


def awq_grouped_linear(x, wq, sz, expert_offsets, group_size, out_features):
    C.check_awq_grouped(x, wq, sz, expert_offsets, group_size, out_features)
    in_f = sz.shape[1] * group_size
    C.require(wq.dtype == torch.int32 and tuple(wq.shape[1:]) == (out_features // 8, in_f), "awq_grouped_linear",
              f"CUDA wq must be int32 [E, {out_features // 8}, {in_f}] (awq_repack per expert, stacked), got "
              f"{wq.dtype} {list(wq.shape)}")
    if not _kernel_ok(x, x.dtype):  # fp32, or a GPU the library does not serve: per-expert loop (host reads offsets)
        return ref.awq_grouped_linear(x, wq, sz, expert_offsets, group_size, out_features, awq_linear)
    x2 = aligned16(x)
    rows, n_exp = x2.shape[0], wq.shape[0]
    cap = torch.cuda.get_device_capability(x.device)
    wgmma = wgmma_ok(x.device, 4)  # its split-K sums in a fixed order: deterministic mode keeps it
    if not wgmma and grouped_gemv_ok(rows, n_exp, cap[0] * 10 + cap[1]):
        path = "gemv"
    elif prefers_dequant(rows, n_exp, x2.dtype, cap, out_features, wgmma):
        path = "dequant"
    else:
        path = "wgmma" if wgmma else "mma"
    return grouped_path(x2, aligned16(wq), aligned16(sz), expert_offsets.to(torch.int32).contiguous(),
                        group_size, out_features, path)
