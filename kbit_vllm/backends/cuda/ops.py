"""CUDA implementations of the kbit_vllm:: ops: argument marshalling into the C API.

Kernels launch on torch's current stream and never allocate: outputs and scratch are torch
tensors made here. kbit_linear picks GEMV / MMA / dequantize + cuBLAS by M inside the op
(dispatch.py); fp32 activations use the reference path.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ... import op_checks as C
from ...formats import block_absmax, check_block_absmax
from .. import reference as ref
from . import dispatch
from .cargs import SUFFIX
from .cargs import cint as _i
from .cargs import ptr as _ptr
from .cargs import stream as _stream
from .grouped_mm import grouped_mm_into, prefers_dequant
from .library import LIB, STATUS, check, sm_count
from .scratch import scratch

_QUANT_FN = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_ACT_FN = SUFFIX


def _sms(device: torch.device) -> int:
    return sm_count(device)


def kbit_quantize(weight: torch.Tensor, codebook: torch.Tensor, k: int):
    C.check_quantize(weight, codebook, k)
    check_block_absmax(block_absmax(weight))  # load-time only: a host sync is acceptable here
    w = weight.contiguous()
    out_f, in_f = w.shape
    packed = torch.empty((out_f, in_f // 32 * k), dtype=torch.int32, device=w.device)
    absmax = torch.empty((out_f, in_f // 32), dtype=torch.uint8, device=w.device)
    if w.numel():
        with torch.cuda.device(w.device):
            fn = getattr(LIB, f"kbit_vllm_quantize_{_QUANT_FN[w.dtype]}")
            check(fn(_ptr(w), _ptr(codebook.contiguous()), ctypes.c_int(k), ctypes.c_int(out_f),
                     ctypes.c_int(in_f), _ptr(packed), _ptr(absmax), _stream(w.device)), "kbit_quantize")
    return packed, absmax


def kbit_dequantize(packed: torch.Tensor, absmax: torch.Tensor, codebook: torch.Tensor, k: int,
                    dtype: torch.dtype) -> torch.Tensor:
    C.check_serialized(packed, absmax, k, "kbit_dequantize")
    C.check_codebook_for(codebook, k, "kbit_dequantize")
    if dtype not in _QUANT_FN:
        return ref.kbit_dequantize(packed, absmax, codebook, k, dtype)
    rows, nb = absmax.shape
    out = torch.empty((rows, nb * 32), dtype=dtype, device=packed.device)
    if out.numel():
        with torch.cuda.device(packed.device):
            fn = getattr(LIB, f"kbit_vllm_dequantize_{_QUANT_FN[dtype]}")
            check(fn(_ptr(packed.contiguous()), _ptr(absmax.contiguous()), _ptr(codebook.contiguous()), _i(k),
                     _i(rows), _i(nb), _ptr(out), _stream(packed.device)), "kbit_dequantize")
    return out


def kbit_repack(packed: torch.Tensor, absmax: torch.Tensor, k: int):
    C.check_serialized(packed, absmax, k, "kbit_repack")
    out_f, nb = absmax.shape
    nt = (out_f + 127) // 128
    pt = torch.empty((nt, nb, k, 128), dtype=torch.int32, device=packed.device)
    at = torch.empty((nt, nb, 128), dtype=torch.uint8, device=packed.device)
    if pt.numel():
        with torch.cuda.device(packed.device):
            check(LIB.kbit_vllm_repack(_ptr(packed.contiguous()), _ptr(absmax.contiguous()), _i(k), _i(out_f),
                                       _i(nb), _ptr(pt), _ptr(at), _stream(packed.device)), "kbit_repack")
    return pt, at


def kbit_unrepack(packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor, k: int, out_features: int):
    C.check_tiled(packed_tiled, absmax_tiled, k, out_features, "kbit_unrepack")
    nb = absmax_tiled.shape[1]
    p = torch.empty((out_features, nb * k), dtype=torch.int32, device=packed_tiled.device)
    a = torch.empty((out_features, nb), dtype=torch.uint8, device=packed_tiled.device)
    if p.numel():
        with torch.cuda.device(packed_tiled.device):
            check(LIB.kbit_vllm_unrepack(_ptr(packed_tiled.contiguous()), _ptr(absmax_tiled.contiguous()), _i(k),
                                         _i(out_features), _i(nb), _ptr(p), _ptr(a), _stream(packed_tiled.device)),
                  "kbit_unrepack")
    return p, a




MMA_MB = (1, 2, 4)  # x rows per row tile / 16 (csrc/kbit_mma.cu instantiations)
MMA_TW = {1: 2, 2: 2, 4: 2}  # mb -> 128-feature layout tiles per row tile (1 or 2)
# Forced paths -> kernel variants of csrc/kbit_mma.cu (MmaVar), instantiated for tw 2 and mb 2 / 4
# (v5: mb 1 / 2), timed beside the default (variant 0) by bench_kbit.py --mma-variants; the "mma"
# path runs dispatch.mma_variant(m, k) (v5 to M = 32 for k <= 4, else v2). All keep partial row tiles in
# accumulator-fragment order (no accumulator moves in the main loop). v1: 1 CTA/SM (255
# registers), 6 stages, per-thread load pointers, a shared table of block scales; v2: v1 with 4
# blocks per stage and 4 stages; v3: the default otherwise; v4: load pointers and scale table at
# the default 2 CTAs/SM and 4 stages; v5 (k <= 4, M <= 32, mb 1 or 2): v4 with the wide pair table,
# the stages' x rows in its unused right halves (2 CTAs/SM).
MMA_VARIANTS = {"mma_v1": 1, "mma_v2": 2, "mma_v3": 3, "mma_v4": 4, "mma_v5": 5}
# Variant 5 is instantiated for mb 1 and 2: with mb 4 (M <= 64) it spilled at 2 CTAs/SM and lost to
# v2 (H200 session 7, M=64 4096x28672 80.3 vs 69.6 µs, 14336x4096 40.6 vs 37.3).
MMA_V5_BUILT_M = 32


def mma_variant_ok(variant: int, k: int, m: int) -> bool:
    """Whether the MMA kernel variant is instantiated for k bits and m rows."""
    return variant != 5 or (k <= 4 and m <= MMA_V5_BUILT_M)


_MMA_OCC: dict[tuple[int, int, int, int, str, int], int] = {}
_MMA_BK: dict[int, int] = {0: 2}  # the default kernel: 2 blocks per stage, known without a library call


def mma_stage_blocks(variant: int) -> int:
    """Quantization blocks per stream-K work unit of an MMA kernel variant (from the library)."""
    if variant not in _MMA_BK:
        bk = int(LIB.kbit_vllm_mma_stage_blocks(_i(variant)))
        if bk <= 0:
            raise ValueError(f"unknown kbit MMA variant {variant}")
        _MMA_BK[variant] = bk
    return _MMA_BK[variant]


def mma_config(dev: torch.device, sfx: str, k: int, m: int, n: int, nb: int,
               tw: int | None = None, variant: int = 0) -> tuple[int, int, int, int]:
    """(mb, tw, ctas, units) of the stream-K MMA: the smallest row tile that holds all M rows (up
    to 64; more rows take several row tiles, each decoding the weights again), and one wave of
    CTAs (resident per SM x SMs), never more than the (row tile, stage) units (a stage is 2
    quantization blocks, or mma_stage_blocks(variant)).

    tw = 2 halves the x fragments each warp reads from shared memory per weight (8 warps all read
    the whole x tile) at the cost of 2x the B registers; it is the default until measured.
    variant != 0 (the dispatched "mma" path and the mma_v* forced paths) has mb 2 or 4 and tw 2;
    variant 5 has mb 1 or 2 (k <= 4, M <= 32) and tw 2."""
    if not mma_variant_ok(variant, k, m):
        raise ValueError(f"kbit_linear MMA variant {variant} takes k <= 4 and M <= {MMA_V5_BUILT_M}, "
                         f"got k={k}, M={m}")
    mb = next((b for b in MMA_MB if m <= 16 * b), MMA_MB[-1])
    tw = tw or MMA_TW[mb]
    if variant:
        mb, tw = (mb if variant == 5 else max(mb, 2)), 2
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), k, mb, tw, sfx, variant)
    if key not in _MMA_OCC:
        if variant:
            occ = getattr(LIB, f"kbit_vllm_mma_variant_ctas_per_sm_{sfx}")(_i(k), _i(mb), _i(tw), _i(variant))
        else:
            occ = getattr(LIB, f"kbit_vllm_mma_ctas_per_sm_{sfx}")(_i(k), _i(mb), _i(tw))
        _MMA_OCC[key] = int(occ)
    occ = _MMA_OCC[key]
    if occ <= 0:
        raise RuntimeError(f"kbit MMA kernel (k={k}, mb={mb}, tw={tw}, variant={variant}) cannot be resident "
                           "on this GPU")
    bk = mma_stage_blocks(variant)
    n_rt = -(-((n + 127) // 128) // tw)
    units = -(-m // (16 * mb)) * n_rt * -(-nb // bk)
    return mb, tw, min(occ * _sms(dev), units), units


# Row tile of the Hopper kernel (csrc/kbit_wgmma.cu); dispatch.WGMMA_RULES are the ranges of M it serves,
# dispatch.wgmma_dense_rows its row tile (the grouped kernels: wgmma_tile_rows).
WGMMA_ROW_TILES = dispatch.WGMMA_ROW_TILES  # x rows per row tile (the wgmma N) of the wgmma kernels
wgmma_tile_rows = dispatch.wgmma_tile_rows
WGMMA_ALL_ROW_TILES = (*WGMMA_ROW_TILES, dispatch.WGMMA_WIDE_ROWS)  # every wgmma kernel is built for these
WGMMA_STAGE_BLOCKS = 2  # quantization blocks per stream-K work unit there
_WG_OCC: dict[tuple[int, int, str, int], int] = {}
_WG_DEV: dict[int, bool] = {}  # device index -> compute capability 9.0 with an sm_90a library


HOPPER_MAX_K = 5  # the wgmma kernels and the tensor-core GEMV (k = 5: csrc/kbit_lut5.cuh)


def wgmma_ok(dev: torch.device | str, k: int) -> bool:
    """Whether the Hopper kernels (wgmma, tensor-core GEMV; sm_90a only) serve k bits on dev: k <= 5
    (pair-table decode, k = 5 by its 10-bit table), compute capability 9.0, and a library built for
    sm_90a (an sm_90 build has no wgmma). The device part is looked up once per device (kbit_linear
    asks on every call)."""
    if k > HOPPER_MAX_K:
        return False
    dev = torch.device(dev)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if idx not in _WG_DEV:
        _WG_DEV[idx] = "sm_90a" in STATUS.archs and torch.cuda.get_device_capability(idx) == (9, 0)
    return _WG_DEV[idx]


def wgmma_config(dev: torch.device, sfx: str, k: int, m: int, n: int, nb: int) -> tuple[int, int, int]:
    """(rows, ctas, row_tiles) of the stream-K wgmma kernel: the row tile height
    (dispatch.wgmma_dense_rows), one wave (resident CTAs per SM x SMs: one for k = 5, the 128-row
    tile and the tall tiles, two for k <= 4 but one on the small layers of dispatch.WGMMA_ONE_CTA; a
    little smaller where that splits the row tiles evenly, dispatch.wgmma_even_grid), never more than
    the (row tile, stage) units; a row tile is dispatch.wgmma_tile_cols(rows) features x rows rows of
    x."""
    cap = torch.cuda.get_device_capability(dev)
    rows = dispatch.wgmma_dense_rows(m, cap, n * nb * 32, k)
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), k, sfx, rows)
    if key not in _WG_OCC:
        _WG_OCC[key] = int(getattr(LIB, f"kbit_vllm_wgmma_ctas_per_sm_{sfx}")(_i(k), _i(rows)))
    if _WG_OCC[key] <= 0:
        raise RuntimeError(f"kbit wgmma kernel (k={k}, {rows} rows) cannot be resident on this GPU")
    row_tiles = -(-n // dispatch.wgmma_tile_cols(rows)) * -(-m // rows)
    stages = -(-nb // WGMMA_STAGE_BLOCKS)
    units = row_tiles * stages
    per_sm = 1 if dispatch.wgmma_one_cta(cap, n * nb * 32, m) else _WG_OCC[key]
    return rows, dispatch.wgmma_even_grid(units, stages, min(per_sm * _sms(dev), units)), row_tiles


# Split-K over a cluster (csrc/kbit_wgmma.cu, launch_wgmma with splits > 0): each row tile's stages
# split evenly over a cluster of 1..WGMMA_CK_MAX_SPLITS CTAs, one an SM, whose sums meet in distributed
# shared memory (no fp32 accumulator in L2), for row tiles of at most WGMMA_CK_MAX_ROWS rows. kbit_linear
# takes it for k <= WGMMA_CK_DISPATCH_K where dispatch.WGMMA_CK_RULES ask (k = 5 is not measured).
WGMMA_CK_MAX_SPLITS = dispatch.WGMMA_CK_MAX_SPLITS
WGMMA_CK_MAX_ROWS = dispatch.WGMMA_CK_MAX_ROWS
WGMMA_CK_DISPATCH_K = 4
_CK_CLUSTERS: dict[tuple, int] = {}


def ck_clusters_cached(dev: torch.device, kernel: tuple, splits: int, query: Callable[[], int]) -> int:
    """Clusters of `splits` CTAs of a split-K wgmma kernel (named by `kernel`, both formats) resident at
    once on dev, one CTA an SM: the SMs for splits = 1, else query()'s answer, asked once per device."""
    if splits == 1:
        return _sms(dev)
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), *kernel, splits)
    if key not in _CK_CLUSTERS:
        _CK_CLUSTERS[key] = int(query())
    return _CK_CLUSTERS[key]


def wgmma_ck_clusters(dev: torch.device, sfx: str, k: int, rows: int, splits: int) -> int:
    """Clusters of `splits` CTAs of the wgmma kernel (k bits, rows-row tiles) resident at once on dev
    (one CTA an SM: the SMs for splits = 1); 0 where none fits."""
    return ck_clusters_cached(dev, ("kbit", k, sfx, rows), splits, lambda: getattr(
        LIB, f"kbit_vllm_wgmma_ck_clusters_{sfx}")(_i(k), _i(rows), _i(splits)))


def wgmma_ck_config(dev: torch.device, sfx: str, k: int, m: int, n: int, nb: int,
                    splits: int | None = None) -> tuple[int, int, int] | None:
    """(rows, splits, row_tiles) of the split-K wgmma launch: the stream-K kernel's row tile height
    (dispatch.wgmma_dense_rows) and, unless given, the cluster size that puts the most CTAs in one
    wave (row tiles x splits, every cluster resident at once; the smaller on a tie); None where the
    row tile is taller than WGMMA_CK_MAX_ROWS or no size fits one wave."""
    rows = dispatch.wgmma_dense_rows(m, torch.cuda.get_device_capability(dev), n * nb * 32, k)
    if rows > WGMMA_CK_MAX_ROWS:
        return None
    row_tiles = -(-n // dispatch.wgmma_tile_cols(rows)) * -(-m // rows)
    if splits is None:
        splits = dispatch.wgmma_ck_splits(row_tiles, -(-nb // WGMMA_STAGE_BLOCKS),
                                          lambda s: wgmma_ck_clusters(dev, sfx, k, rows, s))
    return None if splits is None else (rows, splits, row_tiles)


def wgmma_ck_wanted(dev: torch.device, sfx: str, k: int, m: int, n: int, nb: int) -> bool:
    """Whether kbit_linear's wgmma launch splits K over clusters: k <= WGMMA_CK_DISPATCH_K, the layer
    and m under dispatch.WGMMA_CK_RULES, and a grid of at least dispatch.WGMMA_CK_MIN_FILL of the SMs."""
    if k > WGMMA_CK_DISPATCH_K or not dispatch.wgmma_ck_rule(torch.cuda.get_device_capability(dev), n * nb * 32, m):
        return False
    return dispatch.wgmma_ck_fills(wgmma_ck_config(dev, sfx, k, m, n, nb), _sms(dev))


def path_ok(dev: torch.device, path: str, k: int, m: int) -> bool:
    """Whether a forced tensor-core path ("mma", "mma_tw1", "mma_v1".., "wgmma", "gemv_tc") serves k
    bits and m rows on dev (tests and benchmarks skip the ones that do not; gemv_tc also needs a
    layer of at least one CTA's worth of work units)."""
    if path == "wgmma":
        return wgmma_ok(dev, k)
    if path.startswith("wgmma_ck"):
        return wgmma_ok(dev, k) and m <= WGMMA_CK_MAX_ROWS
    if path == "gemv_tc":
        return 0 < m <= TC_MAX_M and wgmma_ok(dev, k)
    return mma_variant_ok(MMA_VARIANTS.get(path, 0), k, m)


def gemv_config(n: int, nb: int, sms: int, cluster: bool) -> tuple[int, int, int]:
    """(rgpc, wk, splits) for the GEMV: 32-row groups per CTA, warps per row group along K, and
    CTAs of one cluster along K (sm_90 only), so that ~32 warps per SM each stream >= 8 blocks."""
    n_rg = 4 * ((n + 127) // 128)
    per_rg = max(1, min(32 * sms // n_rg, nb // 8))  # warps along K per row group
    if cluster:
        wk = min(per_rg, 8)
        splits = min(8, (per_rg + wk - 1) // wk)
    else:
        wk, splits = min(per_rg, 8), 1
    rgpc = max(1, min(8 // wk, n_rg // sms)) if splits == 1 else 1
    return rgpc, wk, splits


_SK_OCC: dict[tuple[int, int, int, str], int] = {}
_SK_WARPS: dict[int, int] = {}  # k -> warps per CTA of the stream-K GEMVs (csrc/kbit_sk.cuh SkCfg)


def gemv_sk_warps(k: int) -> int:
    """Warps per CTA of the stream-K GEMVs, dense and grouped, at k bits (k = 5: 16, one CTA per SM
    beside its 128 KB table), from the library; 0 where they have no kernel for k."""
    if k not in _SK_WARPS:
        _SK_WARPS[k] = max(0, int(LIB.kbit_vllm_gemv_sk_warps(_i(k))))
    return _SK_WARPS[k]

# M -> (tile, block) units per warp of a full wave at least for the stream-K GEMV; below, the cluster
# GEMV wins. H200 2026-11-21 session 5 (stream-K launched with PDL), k=4 fp16, stream-K / cluster
# µs: M=1 4096x6144 (1.9 units per warp) 8.8 / 10.0, 4096x4096 (1.3) 7.5 / 8.0; M=2 4096x6144
# 11.8 / 11.8, 4096x4096 11.8 / 9.3; M=4 4096x6144 (2.9) 13.2 / 14.8, 4096x4096 (1.9) 12.2 / 11.5.
# M=1 moved from 1.0 to 1.5 in session 14: behind a kernel without PDL that writes x (as vLLM runs
# them; `bench_kbit.py --behind-writer`), k=4 bf16, 4096x4096 (1.3 units per warp) 10.9 / 8.9,
# 4096x6144 (1.9) 10.7 / 11.3 (with PDL overlap, as in the session 5 numbers, stream-K won both).
# M=1 moved to 3.0 in session 17, after the table GEMV staged bf16 x as scaled fp16: behind a writer,
# 4096x6144 bf16 10.8 / 9.7, fp16 10.6 / 9.5; 14336x4096 (4.5 units per warp) bf16 15.1 / 23.5.
# Session 36: bf16 x at M=1 runs the kernel's XS variant (x staged per warp, csrc/kbit_gemv_sk.cu,
# since session 23), which wins from 1.5 units per warp; behind a writer, k=4 (k=2,
# k=3) stream-K / cluster µs by units per warp: 1.29 (4096x4096) 10.0 / 7.5 (8.7 / 7.5, 10.0 / 7.4);
# 1.62 (4096x5120, 8192x2560, 2048x10240) 9.1-9.3 / 8.8-9.3 (8.5 / 9.6, 8.7 / 10.0); 1.78 (4096x5632)
# 9.1 / 9.4 (8.4 / 9.7); 1.94 (4096x6144) 8.8 / 9.6 (8.8 / 9.8), (8192x3072) 9.5 / 11.1; 2.26
# (4096x7168) 10.1 / 11.5 (9.9 / 12.0); 2.59 (4096x8192) 10.7 / 12.1. fp16 x (then read in the
# loop) took it from 2.0. Session 37: fp16 x is staged too; k=4 (k=2) fp16 stream-K / cluster: 1.62
# 9.1 / 9.1 (8.8 / 9.3), 1.78 9.0 / 9.3 (9.0 / 9.4), 1.94 4096x6144 9.6 / 9.5 (9.5 / 9.3), 8192x3072
# 9.6 / 10.9 (9.5 / 11.6), 2048x12288 9.2 / 9.3 (8.5 / 9.0); 4096x28672 21.6 (was 23.5). M=1 from
# 1.5 for both: the kernel stages x when a CTA has >= 12 units (kStageXMinUnits, 8 warps: 1.5 a warp),
# so this bound mirrors it; below, the cluster GEMV wins (1.29: 7.5 against 9.8 stream-K).
# M=2 from 2.2 in session 37, staged x and two units ahead (two CTAs per SM): bf16 (fp16) k=4
# stream-K / cluster µs, 2.42 units a warp (4096x5120) 11.1 / 11.5 (10.7 / 10.8), 2.91 (4096x6144)
# 10.9 / 11.9 (10.9 / 11.3), (8192x3072) 11.7 / 13.8; 1.94 (4096x4096) 10.6 / 9.0 (10.5 / 8.5).
# M=3 (k=4) since session 38: dispatch.TC_ROWS_K4 sends layers of 22-165 M weights here (x staged per
# warp at M <= 4), all of them at 2.7 units a warp or more.
SK_MIN_UNITS: dict[int, float] = {1: 1.5, 2: 2.2, 3: 2.5, 4: 2.5}
# k = 5 (16 warps a CTA, one CTA per SM): M=1 on any layer with a CTA's worth of units (0: a smaller
# grid where the layer has fewer than a wave's), M=2 from 2.5 units per warp (4096x6144), M=3 from 10
# (4096x28672), M=4 never; dispatch.WGMMA_RULES_K5 takes the rows past them. H200 session 34 (bf16
# behind a writer, µs stream-K / best other): M=2 4096x6144 (2.9 units a warp) 13.8 / 14.6,
# 4096x4096 (1.9) 12.2 / 11.5, 2048x5120 (1.2) 11.1 / 9.6; M=3 4096x28672 (13.6) 41.7 / 45.1,
# 14336x4096 (6.8) 28.1 / 26.0; M=4 4096x28672 49.3 / 46.8.
SK_MIN_UNITS_K5: dict[int, float] = {1: 0.0, 2: 2.5, 3: 10.0}


def gemv_sk_ctas(dev: torch.device, sfx: str, k: int, m: int, out_features: int, nb: int,
                 forced: bool = False) -> int:
    """One wave of the stream-K GEMV (resident CTAs per SM x SMs; at M=1, k <= 4, two CTAs an SM on
    layers with few units, dispatch.stream_k_m1_ctas); 0 where the cluster GEMV is faster (fewer than
    SK_MIN_UNITS[m] units per warp of the wave; k = 5: SK_MIN_UNITS_K5) or there is no kernel for k."""
    warps = gemv_sk_warps(k)
    if warps == 0:
        return 0
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), k, m, sfx)
    if key not in _SK_OCC:
        _SK_OCC[key] = int(getattr(LIB, f"kbit_vllm_gemv_sk_ctas_per_sm_{sfx}")(_i(k), _i(m)))
    units, sms = ((out_features + 127) // 128) * nb, _sms(dev)
    grid = dispatch.stream_k_grid(_SK_OCC[key] * sms, units, warps,
                                  (SK_MIN_UNITS_K5 if k == 5 else SK_MIN_UNITS).get(m), forced)
    return dispatch.stream_k_m1_ctas(grid, sms, units, warps) if m == 1 and k <= 4 else grid


# Tensor-core GEMV (csrc/kbit_gemv_tc.cu, Hopper, k <= 5): a work unit is one (128-feature layout
# tile, 32-input block), split evenly over the warps of one wave (one CTA of TC_WARPS warps per SM);
# M <= 8 (x rows are the mma's 8 columns).
TC_WARPS = 16
TC_MAX_M = 8
# Units per warp at least: a smaller grid where the layer is small, as each warp's first units wait
# out the whole load latency and a tile split over many warps costs each of them a reduction.
TC_MIN_UNITS = 2
_TC_OCC: dict[tuple[int, int, str], int] = {}


def gemv_tc_ctas(dev: torch.device, sfx: str, k: int, m: int, out_features: int, nb: int) -> int:
    """CTAs of the tensor-core GEMV: one wave or fewer, so that each warp has TC_MIN_UNITS units
    where the layer allows; 0 where it cannot run (k > 5, M > 8, not Hopper / sm_90a, or fewer
    units than one CTA's warps)."""
    if not 0 < m <= TC_MAX_M or not wgmma_ok(dev, k):
        return 0
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), k, sfx)
    if key not in _TC_OCC:
        _TC_OCC[key] = max(0, int(getattr(LIB, f"kbit_vllm_gemv_tc_ctas_per_sm_{sfx}")(_i(k))))
    units = ((out_features + 127) // 128) * nb
    if units < TC_WARPS:
        return 0
    return min(_TC_OCC[key] * _sms(dev), max(1, units // (TC_WARPS * TC_MIN_UNITS)))


_ROWS_OCC: dict[tuple[int, int, int, str], dict[int, int]] = {}


def gemv_rows_slice(dev: torch.device, dtype: torch.dtype, k: int, out_features: int, nb: int) -> int:
    """dispatch.gemv_rows_slice with the row-slice kernel's resident CTAs an SM for (k, nb) and each
    slice, from the library (which picks the kernel's depth: no copy of its rule here)."""
    sfx = _ACT_FN[dtype]
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), k, nb, sfx)
    if key not in _ROWS_OCC:
        fn = getattr(LIB, f"kbit_vllm_gemv_rows_ctas_per_sm_{sfx}")
        _ROWS_OCC[key] = {r: max(0, int(fn(_i(k), _i(nb), _i(r)))) for r in dispatch.ROWS_SLICES}
    return dispatch.gemv_rows_slice(out_features, nb, _sms(dev), _ROWS_OCC[key])


def gemv_rows(x2: torch.Tensor, packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor, codebook: torch.Tensor,
              bias: torch.Tensor | None, k: int, out_features: int, y: torch.Tensor, rows: int = 0) -> torch.Tensor:
    """y = x2 W^T (+ bias) through the row-slice GEMV (csrc/kbit_gemv_rows.cu): M=1, k <= 4, rows
    output rows per CTA (0: dispatch.gemv_rows_slice's choice)."""
    m, in_f = x2.shape
    nb = in_f // 32
    dev = x2.device
    if not rows:
        rows = gemv_rows_slice(dev, x2.dtype, k, out_features, nb)
    if m != 1 or k > 4 or nb > dispatch.ROWS_MAX_BLOCKS or rows not in dispatch.ROWS_SLICES:
        raise ValueError(f"kbit_linear gemv_rows path takes M=1, k <= 4, at most {dispatch.ROWS_MAX_BLOCKS * 32} "
                         f"inputs and a slice of {dispatch.ROWS_SLICES} rows that fits one wave, got M={m}, k={k}, "
                         f"in={in_f}, out={out_features}, rows={rows}")
    check(getattr(LIB, f"kbit_vllm_gemv_rows_{_ACT_FN[x2.dtype]}")(
        _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(bias), _i(k), _i(m),
        _i(out_features), _i(nb), _ptr(y), _i(rows), _stream(dev)), "kbit_linear (gemv_rows)")
    return y


def linear_path(x2: torch.Tensor, packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor, codebook: torch.Tensor,
                bias: torch.Tensor | None, k: int, out_features: int, path: str) -> torch.Tensor:
    """y [M, out] for a contiguous 2-D fp16/bf16 x through one named kernel path.

    Public so tests and benchmarks can exercise every path; kbit_linear picks the path itself.
    "gemv" is the row-slice GEMV at M=1 where dispatch.use_gemv_rows takes it, else the stream-K
    table GEMV where the layer has enough units (SK_MIN_UNITS, k = 5: SK_MIN_UNITS_K5; outside
    deterministic mode), else the cluster GEMV; "gemv_rows" (auto slice) / "gemv_rows8".."gemv_rows64",
    "gemv_sk" and "gemv_cluster" name one of them.
    "mma" is the stream-K tensor-core kernel (dispatch.mma_variant(m)) with its default row-tile
    width; "mma_tw1" and "mma_tw2" force the default kernel at 128 or 256 features per row tile;
    "mma_v1".. force a kernel variant (MMA_VARIANTS). "wgmma" is the Hopper kernel (wgmma_ok);
    "wgmma_ck" the same kernel split-K over clusters (wgmma_ck_config), "wgmma_ck1".."wgmma_ck8" at that
    cluster size; "gemv_tc" the Hopper tensor-core GEMV (M <= 8, wgmma_ok).
    """
    m, in_f = x2.shape
    nb = in_f // 32
    dev = x2.device
    sfx = _ACT_FN[x2.dtype]
    stream = _stream(dev)
    if path == "dequant":
        w = torch.empty((out_features, in_f), dtype=x2.dtype, device=dev)
        check(getattr(LIB, f"kbit_vllm_dequantize_tiled_{sfx}")(
            _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _i(k), _i(out_features), _i(nb), _ptr(w),
            stream), "kbit_linear (dequantize)")
        return F.linear(x2, w, bias)
    y = torch.empty((m, out_features), dtype=x2.dtype, device=dev)
    if m == 0:
        return y
    if path.startswith("gemv_rows"):
        tail = path[len("gemv_rows"):]
        if tail and not tail.isdigit():
            raise ValueError(f"unknown kbit_linear path {path!r}: gemv_rows takes a slice of "
                             f"{dispatch.ROWS_SLICES} rows (gemv_rows32) or none (its own choice)")
        return gemv_rows(x2, packed_tiled, absmax_tiled, codebook, bias, k, out_features, y, int(tail or 0))
    if path in ("gemv", "gemv_sk", "gemv_cluster") and m > dispatch.GEMV_MAX_M:
        raise ValueError(f"kbit_linear {path} path takes M <= {dispatch.GEMV_MAX_M}, got {m}")
    if path == "gemv" and m == 1 and dispatch.use_gemv_rows(k, in_f, out_features,
                                                             torch.cuda.get_device_capability(dev)):
        rows = gemv_rows_slice(dev, x2.dtype, k, out_features, nb)
        if rows:  # deterministic too: its sums meet in a fixed order
            return gemv_rows(x2, packed_tiled, absmax_tiled, codebook, bias, k, out_features, y, rows)
    use_sk = (path == "gemv" and not dispatch.deterministic()) or path == "gemv_sk"
    ctas = gemv_sk_ctas(dev, sfx, k, m, out_features, nb, forced=path == "gemv_sk") if use_sk else 0
    if path == "gemv_sk" and ctas == 0:
        raise ValueError(f"kbit_linear gemv_sk path takes k <= 5 and at least one CTA's warps "
                         f"({gemv_sk_warps(k)}) of (tile, block) units, on a GPU whose shared memory holds "
                         f"its table, got k={k}, units={((out_features + 127) // 128) * nb}")
    # The stream-K GEMVs (CUDA-core and tensor-core) share a signature: a one-wave grid, a zeroed fp32
    # accumulator row per x row and a counter per layout tile (both left zeroed).
    def stream_k(kernel: str, grid: int) -> torch.Tensor:
        ws = scratch(dev, "accum", ((out_features + 127) // 128) * 128 * m)
        ctr = scratch(dev, "counters", (out_features + 127) // 128)
        check(getattr(LIB, f"kbit_vllm_{kernel}_{sfx}")(
            _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(bias), _i(k), _i(m),
            _i(out_features), _i(nb), _ptr(y), _i(grid), _ptr(ws), _ptr(ctr), stream), f"kbit_linear ({kernel})")
        return y

    if ctas > 0:
        return stream_k("gemv_sk", ctas)
    if path in ("gemv", "gemv_cluster"):
        rgpc, wk, splits = gemv_config(out_features, nb, _sms(dev), torch.cuda.get_device_capability(dev)[0] >= 9)
        check(getattr(LIB, f"kbit_vllm_gemv_{sfx}")(
            _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(bias), _i(k), _i(m),
            _i(out_features), _i(nb), _ptr(y), _i(rgpc), _i(wk), _i(splits), stream), "kbit_linear (gemv)")
        return y
    if path == "gemv_tc":
        ctas = gemv_tc_ctas(dev, sfx, k, m, out_features, nb)
        if ctas == 0:
            raise ValueError(f"kbit_linear gemv_tc path takes k <= {HOPPER_MAX_K}, M <= {TC_MAX_M} and >= {TC_WARPS} "
                             f"(tile, block) units on compute capability 9.0 with an sm_90a library, got k={k}, "
                             f"M={m}, units={((out_features + 127) // 128) * nb}, capability "
                             f"{torch.cuda.get_device_capability(dev)}")
        return stream_k("gemv_tc", ctas)
    if path == "wgmma":
        if not wgmma_ok(dev, k):
            raise ValueError(f"kbit_linear wgmma path takes k <= {HOPPER_MAX_K} on compute capability 9.0, got "
                             f"k={k} on {torch.cuda.get_device_capability(dev)}")
        rows, ctas, row_tiles = wgmma_config(dev, sfx, k, m, out_features, nb)
        # Partial row tiles: a zeroed fp32 accumulator per row tile and a counter (both left zeroed).
        ws = scratch(dev, "accum", row_tiles * rows * dispatch.wgmma_tile_cols(rows))
        ctr = scratch(dev, "counters", row_tiles)
        check(getattr(LIB, f"kbit_vllm_wgmma_{sfx}")(
            _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(bias), _i(k), _i(m),
            _i(out_features), _i(nb), _ptr(y), _i(rows), _i(ctas), _ptr(ws), _ptr(ctr), stream),
              "kbit_linear (wgmma)")
        return y
    if path.startswith("wgmma_ck"):
        forced = dispatch.wgmma_ck_path_splits(path, "kbit_linear")
        if not wgmma_ok(dev, k):
            raise ValueError(f"kbit_linear {path!r} path takes k <= {HOPPER_MAX_K} on compute capability 9.0, got "
                             f"k={k} on {torch.cuda.get_device_capability(dev)}")
        rows, splits, row_tiles = dispatch.wgmma_ck_launch(
            wgmma_ck_config(dev, sfx, k, m, out_features, nb, forced), -(-nb // WGMMA_STAGE_BLOCKS), "kbit_linear",
            path, f"M={m}, in={in_f}, out={out_features}", WGMMA_CK_MAX_ROWS)
        check(getattr(LIB, f"kbit_vllm_wgmma_ck_{sfx}")(
            _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(bias), _i(k), _i(m),
            _i(out_features), _i(nb), _ptr(y), _i(rows), _i(splits), _i(row_tiles * splits), stream),
              "kbit_linear (wgmma_ck)")
        return y
    if path not in ("mma", "mma_tw1", "mma_tw2", *MMA_VARIANTS):
        raise ValueError(f"unknown kbit_linear path {path!r}")
    variant = dispatch.mma_variant(m, k) if path == "mma" else MMA_VARIANTS.get(path, 0)
    forced_tw = None if path == "mma" or variant else int(path[-1])
    mb, tw, ctas, units = mma_config(dev, sfx, k, m, out_features, nb, forced_tw, variant)
    det = dispatch.deterministic()
    row_tiles = units // -(-nb // mma_stage_blocks(variant))
    tile_floats = 16 * mb * 128 * tw
    # Partial row tiles: a zeroed accumulator per row tile (left zeroed), or in deterministic
    # mode a slot per (CTA, head / tail segment) that the last CTA sums in CTA order.
    ws = (scratch(dev, "partials", 2 * ctas * tile_floats) if det
          else scratch(dev, "accum", row_tiles * tile_floats))
    ctr = scratch(dev, "counters", row_tiles)
    if variant:
        check(getattr(LIB, f"kbit_vllm_mma_variant_{sfx}")(
            _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(bias), _i(k), _i(m),
            _i(out_features), _i(nb), _ptr(y), _i(mb), _i(tw), _i(variant), _i(ctas), _i(int(det)), _ptr(ws),
            _ptr(ctr), stream), f"kbit_linear ({path})")
        return y
    check(getattr(LIB, f"kbit_vllm_mma_{sfx}")(
        _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(bias), _i(k), _i(m),
        _i(out_features), _i(nb), _ptr(y), _i(mb), _i(tw), _i(ctas), _i(int(det)), _ptr(ws), _ptr(ctr), stream),
        "kbit_linear (mma)")
    return y


def kbit_linear(x: torch.Tensor, packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor, codebook: torch.Tensor,
                bias: torch.Tensor | None, k: int, out_features: int) -> torch.Tensor:
    C.check_kbit_linear(x, packed_tiled, absmax_tiled, codebook, bias, k, out_features)
    if x.dtype not in _ACT_FN:
        return ref.kbit_linear(x, packed_tiled, absmax_tiled, codebook, bias, k, out_features)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    x2 = aligned16(x2)
    dev = x.device
    wgmma = not dispatch.deterministic() and wgmma_ok(dev, k)
    cc = torch.cuda.get_device_capability(dev)
    path = dispatch.choose_path(x2.shape[0], cc, x2.shape[1] * out_features, k, wgmma)
    if path == "gemv_tc" and gemv_tc_ctas(dev, _ACT_FN[x2.dtype], k, x2.shape[0], out_features, x2.shape[1] // 32) == 0:
        path = dispatch.choose_path(x2.shape[0], cc, x2.shape[1] * out_features, k, False)  # too few units
    if path == "wgmma" and wgmma_ck_wanted(dev, _ACT_FN[x2.dtype], k, x2.shape[0], out_features, x2.shape[1] // 32):
        path = "wgmma_ck"
    with torch.cuda.device(dev):
        y = linear_path(x2, aligned16(packed_tiled), aligned16(absmax_tiled), codebook.contiguous(),
                        None if bias is None else bias.contiguous(), k, out_features, path)
    return y.reshape(*lead, out_features)


def aligned16(t: torch.Tensor) -> torch.Tensor:
    """t contiguous at a 16-byte-aligned address: the kernels read x and the weights in 16-byte
    vectors, bulk copies and L2 prefetches (a view at an odd offset is copied, never read misaligned)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


# --- MoE: kbit_grouped_linear ------------------------------------------------------------------
# One launch covers every expert; the kernels read expert_offsets on the device. Grid sizes come
# from host-known shapes only (rows, experts), so the op is graph-capturable and never syncs.


GGEMV_GROUP_BLOCKS = 4  # blocks of a slot GEMV warp's load group (csrc/kbit_grouped_gemv.cu kGU)
GGEMV_MAX_WARPS = 16  # warps per CTA of the slot GEMV at most (kGThreads / 32)


def grouped_gemv_config(n: int, nb: int, slots: int, sms: int) -> tuple[int, int]:
    """(rgpc, wk) for the slot GEMV: 32-row groups per CTA and warps per row group along K.

    As many warps along K as ~16 warps an SM allow (two CTAs of 8, or one of 16, fit in registers),
    counting `slots` experts (the most that can have rows), down to one load group each: the
    kernel is a chain of round trips, and a warp with fewer blocks ends sooner. CTAs of 8 warps
    where a row group takes fewer. H200 session 44, k=4 fp16 back to back, µs: seed8 gate T=1 (64
    blocks) 8 / 16 warps along K 5.3 / 4.4; qwen128 down T=1 (24 blocks) 2 / 4 warps 6.9 / 5.9.
    """
    n_rg = 4 * ((n + 127) // 128)
    fit = max(1, 16 * sms // (n_rg * slots))
    groups = max(1, nb // GGEMV_GROUP_BLOCKS)
    wk = 1 << (min(fit, groups, GGEMV_MAX_WARPS).bit_length() - 1)  # 1, 2, 4, 8 or 16
    rgpc = max(1, min(8 // wk, n_rg))
    return rgpc, wk


_GSK_OCC: dict[tuple[int, int, int, str], int] = {}
GSK_MIN_UNITS = 2  # (item, tile, block) units per warp at least (the kernel's own bound)
GSK_MAX_ROWS = 4  # rows per pass: the kernel is instantiated for 1..4


def grouped_gemv_sk_config(dev: torch.device, sfx: str, k: int, rows: int, n_exp: int, n: int,
                           nb: int, mp: int | None = None) -> tuple[int, int, int]:
    """(mp, max_items, ctas) for the grouped stream-K GEMV: rows per pass (dispatch.grouped_sk_rows
    unless given, at most 4), the bound on (expert, pass) items, and a one-wave grid (resident
    CTAs per SM x SMs, fewer when even max_items cannot feed them); ctas 0 = not usable (no kernel
    for k, or it does not fit this GPU's shared memory)."""
    mp = min(GSK_MAX_ROWS, mp or dispatch.grouped_sk_rows(rows, n_exp))
    slots = min(n_exp, rows)
    max_items = (rows + slots * (mp - 1)) // mp
    warps = gemv_sk_warps(k)  # the grouped kernel's CTA shape is the dense one's (SkCfg)
    if warps == 0:
        return mp, max_items, 0
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), k, mp, sfx)
    if key not in _GSK_OCC:
        _GSK_OCC[key] = int(getattr(LIB, f"kbit_vllm_grouped_gemv_sk_ctas_per_sm_{sfx}")(_i(k), _i(mp)))
    units = max_items * ((n + 127) // 128) * nb
    if _GSK_OCC[key] == 0:
        return mp, max_items, 0
    return mp, max_items, max(1, min(_GSK_OCC[key] * _sms(dev), -(-units // (warps * GSK_MIN_UNITS))))


GMMA_CTAS_PER_SM = {16: 3, 32: 3, 64: 2, 128: 1}  # resident CTAs per SM (csrc/kbit_grouped_mma.cu kMinCtas)


def grouped_mma_config(rows: int, n_exp: int, n: int, nb: int, sms: int, bm: int | None = None,
                       capability: tuple[int, int] = (9, 0)) -> tuple[int, int, int]:
    """(bm, items, splits) for the grouped MMA: the row tile, the grid's work-item bound and the
    K splits that bring the expected CTAs to about one wave of resident CTAs (split only when the
    unsplit grid fills under half of it: each split adds a partial-sum pass). A dispatched tile
    halves (down to 16) while the layer has fewer (expert, row tile, n-tile) tiles than SMs: few
    experts with many rows each (seed 002's 8 experts) otherwise leave most SMs to split-K."""
    active = max(1, min(n_exp, rows))
    per = dispatch.grouped_rows_per_expert(rows, n_exp)
    n_tiles = (n + 127) // 128
    if not bm:
        bm = dispatch.grouped_bm(per, capability)
        while bm > 16 and active * -(-per // bm) * n_tiles < sms:
            bm //= 2
    items = (rows + active * (bm - 1)) // bm  # sum over experts of ceil(rows_e / bm), at most
    tiles = active * -(-per // bm) * n_tiles
    target = GMMA_CTAS_PER_SM.get(bm, 1) * sms
    stages = (nb + 1) // 2
    splits = 1
    if 2 * tiles <= target:  # a nearly full wave is better than split-K's extra pass
        splits = max(1, min(-(-target // tiles), stages // 4, 16))
    return bm, items, splits


def grouped_path(x2: torch.Tensor, packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor, codebook: torch.Tensor,
                 offsets: torch.Tensor, k: int, out_features: int, path: str, bm: int | None = None,
                 out: torch.Tensor | None = None, mp: int | None = None) -> torch.Tensor:
    """y [rows, out] for a contiguous 2-D fp16/bf16 x (rows sorted by expert) through one kernel.

    offsets: int32 [E + 1] on the device. Paths: "gemv" is the stream-K GEMV over the active
    experts (outside deterministic mode) unless few experts' weights are read
    (dispatch.grouped_slot_gemv), else the slot GEMV; "gemv_sk" / "gemv_slot" name one of them
    (gemv_sk falls back as gemv does where stream-K is not usable); "mma" the grouped MMA (row tile
    bm, default by the expected rows per expert); "wgmma" the Hopper kernel (wgmma_ok; bm its row
    tile of 16, 32, 64 or 128: WGMMA_ALL_ROW_TILES). mp forces the stream-K GEMV's rows per pass
    (1..4). Public so tests and benchmarks can run every path; out, if given, receives the result
    (tests poison it).
    """
    rows, in_f = x2.shape
    nb = in_f // 32
    n_exp = packed_tiled.shape[0]
    dev = x2.device
    sfx = _ACT_FN[x2.dtype]
    if path == "dequant" and rows > 0:  # torch's grouped GEMM allocates the output itself
        return _grouped_dequant_mm(x2, packed_tiled, absmax_tiled, codebook, offsets, k, out_features, out)
    y = torch.empty((rows, out_features), dtype=x2.dtype, device=dev) if out is None else out
    if rows == 0:
        return y
    slots = min(n_exp, rows)
    stream = _stream(dev)
    n_tiles = (out_features + 127) // 128
    if path in ("gemv", "gemv_sk", "gemv_slot"):
        rgpc, wk = grouped_gemv_config(out_features, nb, slots, _sms(dev))  # the slot GEMV's grid
        if path != "gemv_slot" and not dispatch.deterministic():
            mp, max_items, ctas = grouped_gemv_sk_config(dev, sfx, k, rows, n_exp, out_features, nb, mp)
            if ctas > 0 and (path == "gemv_sk" or not dispatch.grouped_slot_gemv(
                    slots, n_tiles, nb, torch.cuda.get_device_capability(dev), k, -(-nb // wk))):
                acc = scratch(dev, "accum", max_items * n_tiles * 128 * mp)
                ctr = scratch(dev, "counters", max_items * n_tiles)
                check(getattr(LIB, f"kbit_vllm_grouped_gemv_sk_{sfx}")(
                    _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(offsets), _ptr(y),
                    _i(k), _i(n_exp), _i(rows), _i(out_features), _i(nb), _i(mp), _i(max_items), _i(ctas),
                    _ptr(acc), _ptr(ctr), stream), "kbit_grouped_linear (gemv)")
                return y
        check(getattr(LIB, f"kbit_vllm_grouped_gemv_{sfx}")(
            _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(offsets), _ptr(y), _i(k),
            _i(n_exp), _i(rows), _i(out_features), _i(nb), _i(slots), _i(rgpc), _i(wk), stream),
            "kbit_grouped_linear (gemv)")
        return y
    if path == "wgmma":
        if not wgmma_ok(dev, k):
            raise ValueError(f"kbit_grouped_linear wgmma path takes k <= {HOPPER_MAX_K} on compute capability 9.0 "
                             f"with an sm_90a library, got k={k} on {torch.cuda.get_device_capability(dev)}")
        r, items, splits = dispatch.grouped_wgmma_config(rows, n_exp, in_f, out_features, _sms(dev), k, bm,
                                                         wide_cost=dispatch.wgmma_wide_tile_cost(k))
        one_cta = dispatch.grouped_wgmma_one_cta(rows, n_exp, in_f, out_features, r, splits, _sms(dev), k)
        ws = scratch(dev, "partials", splits * rows * out_features) if splits > 1 else None
        check(getattr(LIB, f"kbit_vllm_grouped_wgmma_{sfx}")(
            _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(offsets), _ptr(y), _i(k),
            _i(n_exp), _i(rows), _i(out_features), _i(nb), _i(r), _i(items), _i(splits), _i(int(one_cta)), _ptr(ws),
            stream),
              "kbit_grouped_linear (wgmma)")
        return y
    if path != "mma":
        raise ValueError(f"unknown kbit_grouped_linear path {path!r}")
    bm, items, splits = grouped_mma_config(rows, n_exp, out_features, nb, _sms(dev), bm,
                                           torch.cuda.get_device_capability(dev))
    ws = ctr = None
    if splits > 1:  # per-split fp32 partials, summed in split order (deterministic in every mode)
        ws = scratch(dev, "partials", splits * rows * out_features)
        ctr = scratch(dev, "counters", items * n_tiles)
    check(getattr(LIB, f"kbit_vllm_grouped_mma_{sfx}")(
        _ptr(x2), _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _ptr(offsets), _ptr(y), _i(k), _i(n_exp),
        _i(rows), _i(out_features), _i(nb), _i(bm), _i(items), _i(splits), _ptr(ws), _ptr(ctr), stream),
        "kbit_grouped_linear (mma)")
    return y


def _grouped_dequant_mm(x2: torch.Tensor, packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor,
                        codebook: torch.Tensor, offsets: torch.Tensor, k: int, out_features: int,
                        out: torch.Tensor | None) -> torch.Tensor:
    """Prefill-sized grouped linear (bf16): every expert dequantized in one launch (the stacked
    tiled weights are one tiled matrix of E * n_tiles tiles), then torch's grouped GEMM."""
    n_exp, nt = packed_tiled.shape[0], packed_tiled.shape[1]
    in_f = x2.shape[1]
    w = torch.empty((n_exp * nt * 128, in_f), dtype=x2.dtype, device=x2.device)
    check(LIB.kbit_vllm_dequantize_tiled_bf16(
        _ptr(packed_tiled), _ptr(absmax_tiled), _ptr(codebook), _i(k), _i(n_exp * nt * 128), _i(in_f // 32),
        _ptr(w), _stream(x2.device)), "kbit_grouped_linear (dequantize)")
    w3 = w.view(n_exp, nt * 128, in_f)
    if out_features != nt * 128:
        w3 = w3[:, :out_features].contiguous()
    return grouped_mm_into(x2, w3, offsets, out)


def device_offsets(expert_offsets: torch.Tensor) -> torch.Tensor:
    """The int32 contiguous offsets the kernels read (a device-side cast for int64; no host sync)."""
    return expert_offsets.to(torch.int32).contiguous()


def kbit_grouped_linear(x: torch.Tensor, packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor,
                        codebook: torch.Tensor, expert_offsets: torch.Tensor, k: int,
                        out_features: int) -> torch.Tensor:
    C.check_grouped(x, packed_tiled, absmax_tiled, codebook, expert_offsets, k, out_features)
    if x.dtype not in _ACT_FN:  # fp32 is no serving dtype: the reference (reads the offsets on the host)
        return ref.kbit_grouped_linear(x, packed_tiled, absmax_tiled, codebook, expert_offsets, k, out_features)
    x2 = aligned16(x)
    dev = x.device
    cap = torch.cuda.get_device_capability(dev)
    path = dispatch.choose_grouped_path(x2.shape[0], packed_tiled.shape[0], cap)
    if dispatch.grouped_wgmma_rows(x2.shape[0], packed_tiled.shape[0], cap, k) and wgmma_ok(dev, k):
        path = "wgmma"  # its split-K sums in a fixed order: deterministic mode keeps it
    if path != "gemv" and prefers_dequant(x2.shape[0], packed_tiled.shape[0], x2.dtype, cap, out_features,
                                          wgmma_ok(dev, k), kbit=True):
        path = "dequant"
    with torch.cuda.device(dev):
        return grouped_path(x2, aligned16(packed_tiled), aligned16(absmax_tiled), codebook.contiguous(),
                            device_offsets(expert_offsets), k, out_features, path)
