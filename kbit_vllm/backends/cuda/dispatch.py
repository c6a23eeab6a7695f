"""kbit_linear's choice of kernel by M (rows of x), one table per GPU architecture.

Filled from benchmarks/bench_kbit.py on the device (see benchmarks/RESULTS.md). Each entry:
(largest M for the GEMV, largest M for the MMA kernel); larger M dequantizes into a torch
buffer and calls torch's matmul (cuBLAS).
"""

from __future__ import annotations

# (major, minor) -> (gemv_max_m, mma_max_m)
THRESHOLDS: dict[tuple[int, int], tuple[int, int]] = {
    (9, 0): (4, 64),  # H200, benchmarks/RESULTS.md 2026-11-21: summed over 9 shapes
}
DEFAULT = (4, 64)
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
