"""Launch-configuration rules of the CUDA backend that need no GPU: they only compute numbers, and
a wrong one costs speed silently (the kernels stay correct), so the measured rules are pinned here."""

from __future__ import annotations

import pytest

from kbit_vllm.backends.cuda import dispatch
from kbit_vllm.backends.cuda.ops import grouped_mma_config

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


def test_grouped_mma_forced_tile_is_kept() -> None:
    assert grouped_mma_config(64 * 8, 8, 512, 64, H200_SMS, bm=64)[0] == 64
