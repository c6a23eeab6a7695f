"""kbit_linear's choice of kernel by M (rows of x), one table per GPU architecture; below, the
grouped (MoE) ops' choice by the expected rows per expert.

Filled from benchmarks/bench_kbit.py on the device (see benchmarks/RESULTS.md). Each entry:
(largest M for the GEMV, largest M for the MMA kernel); larger M dequantizes into a torch
buffer and calls torch's matmul (cuBLAS).
"""

from __future__ import annotations

# (major, minor) -> (gemv_max_m, mma_max_m)
THRESHOLDS: dict[tuple[int, int], tuple[int, int]] = {
    # H200, benchmarks/RESULTS.md 2026-11-21 (GEMV/dequant rewrite): summed over the 9 shapes, k=4,
    # the MMA beats dequant + cuBLAS at M=8 and 16 (236 vs 338 us, 281 vs 334), loses from M=32 (399 vs 338).
    (9, 0): (4, 16),
}
DEFAULT = (4, 16)
GEMV_MAX_M = 4  # the GEMV kernel is instantiated for M = 1..4


def thresholds(capability: tuple[int, int]) -> tuple[int, int]:
    """(gemv_max_m, mma_max_m) for a compute capability."""
    return THRESHOLDS.get(capability, DEFAULT)


def choose_path(m: int, capability: tuple[int, int]) -> str:
    """'gemv', 'mma' or 'dequant' for an activation with m rows."""
    gemv_max, mma_max = thresholds(capability)
    if m <= min(gemv_max, GEMV_MAX_M):
        return "gemv"
    if m <= mma_max:
        return "mma"
    return "dequant"


# --- MoE grouped ops (kbit_grouped_linear) ----------------------------------------------------
# Rows of x per expert are only known on the device, so the choice follows the expected rows per
# active expert, ceil(rows / min(experts, rows)), from host-known shapes. Each entry: the largest
# expected rows per expert served by the grouped GEMV; more go to the grouped MMA, whose row tile
# (16, 32, 64 or 128) covers the expected rows. First guesses, to be measured with
# benchmarks/bench_moe.py.
GROUPED_GEMV_MAX: dict[tuple[int, int], int] = {
    (9, 0): 4,
}
GROUPED_DEFAULT = 4


def grouped_rows_per_expert(rows: int, n_exp: int) -> int:
    """Expected rows per expert that has any, if routing spreads rows evenly over the experts."""
    active = max(1, min(n_exp, rows))
    return -(-rows // active)


def choose_grouped_path(rows: int, n_exp: int, capability: tuple[int, int]) -> str:
    """'gemv' or 'mma' for a grouped op over rows x rows and n_exp experts."""
    gemv_max = GROUPED_GEMV_MAX.get(capability, GROUPED_DEFAULT)
    return "gemv" if grouped_rows_per_expert(rows, n_exp) <= gemv_max else "mma"


def grouped_bm(rows_per_expert: int, largest: int = 128) -> int:
    """Row tile of the grouped MMA: the smallest of 16, 32, 64, 128 (up to largest) covering the rows."""
    for bm in (16, 32, 64, 128):
        if rows_per_expert <= bm or bm >= largest:
            return bm
    return largest
