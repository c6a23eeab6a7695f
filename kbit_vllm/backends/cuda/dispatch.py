"""kbit_linear's choice of kernel by M (rows of x), one table per GPU architecture.

Filled from benchmarks/bench_kbit.py on the device (see benchmarks/RESULTS.md). Each entry:
(largest M for the GEMV, largest M for the MMA kernel); larger M dequantizes into a torch
buffer and calls torch's matmul (cuBLAS).
"""

from __future__ import annotations

import os

DETERMINISTIC_ENV = "KBIT_VLLM_DETERMINISTIC"


def deterministic() -> bool:
    """KBIT_VLLM_DETERMINISTIC=1: only kernels whose split-K sums run in a fixed order, so the
    same input gives the same bits (the stream-K GEMV adds its partials with float atomics)."""
    return os.environ.get(DETERMINISTIC_ENV, "0") not in ("", "0", "false", "False")

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
