"""benchmarks/bench_floor.py's verdicts (which target the read of the weights leaves reachable) on any
machine; the timings themselves need a GPU (run on the device)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import bench_floor  # noqa: E402
from bench_kbit import LLAMA, SEED_DENSE  # noqa: E402


def _dense(name: str, in_f: int, out_f: int, read: float, mode: str = "b2b") -> dict:
    return {"mode": mode, "shape": name, "in": in_f, "out": out_f, "cublas_fp16": 6.0, "cublas_bf16": 6.1,
            "read_fp16": 4.0, "k4_op_fp16": 5.0, "k4_op_bf16": 5.2, "k4_read": read, "k4_floor": 1.0,
            "k2_op_fp16": 4.5, "k2_op_bf16": 4.6, "k2_read": read, "awq_op": 6.0, "awq_read": read, "awq_floor": 2.0,
            "tinygemm": 9.0 if (name, in_f, out_f) in LLAMA else None}


def _lines(text: str, start: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(start)]


def test_verdicts_follow_the_read() -> None:
    launch = {"writer": 2.0, "b2b": 1.2}
    # Seed layers read in 2.5 µs: cuBLAS's 30 µs over 12.5 is 2.4x, below 2.5x (k=4) and 3x (k=2).
    dense = [_dense(n, i, o, 2.5) for n, i, o in SEED_DENSE]
    # The big Llama layers: 1.25x a 1.0 µs floor is 1.25 µs; a read of 1.2 fits it, 1.3 does not.
    dense += [_dense(n, i, o, 1.2 if n == "l3_gateup" else 1.3) for n, i, o in LLAMA]
    moe = [{"scenario": "seed8", "shape": s, "tokens": 1, "rows": 8, "active": 8, "fp16_bmm": 7.0, "k4_op": 7.5,
            "k4_read": 3.0} for s in ("gate", "down")]
    text = bench_floor.summarize(dense, moe, launch)
    assert "back to back 1.20 µs, behind a writer 2.00 µs" in text
    assert "### Dense layers, M=1, back to back" in text and "behind a writer of x" not in text
    seed = _lines(text, "| issue 3: seed 002")
    assert seed == ["| issue 3: seed 002 M=1 summed, k=4, x cuBLAS fp16 | 2.50x | 1.20x | 2.40x | no |",
                    "| issue 3: seed 002 M=1 summed, k=2, x cuBLAS fp16 | 3.00x | 1.33x | 2.40x | no |"]
    big = _lines(text, "| issue 3: 4096x28672") + _lines(text, "| issue 3: 14336x4096")
    assert big[0].endswith("| <= 1.25 µs | 5.00 µs | 1.20 µs | yes |") and big[1].endswith("| no |")
    awq = _lines(text, "| issue 4: 4096x28672")
    assert awq[0].endswith("| <= 2.60 µs | 6.00 µs | 1.20 µs | yes |")  # 1.3 x 2.0 floor
    assert awq[1].endswith("| <= 5.00 µs | 6.00 µs | 1.20 µs | yes |")  # tinygemm 9.0 / 1.8
    assert _lines(text, "| issue 6: seed8 T=1") == [
        "| issue 6: seed8 T=1 gate + down k=4, x fp16 bmm | 2.0x | 0.93x | 2.33x | yes |"]
    assert len(_lines(text, "| seed8 |")) == 2
    assert _lines(text, "| 2048x5120 |") == [
        "| 2048x5120 | 6.00 | 6.10 | 4.00 | 5.00 / 5.20 | 2.50 | 1.00 | 4.50 / 4.60 | 2.50 | 6.00 | 2.50 | 2.00 | - |"]


def test_modes_get_their_own_tables() -> None:
    dense = [_dense(n, i, o, 2.5, mode) for mode in ("b2b", "writer") for n, i, o in SEED_DENSE]
    text = bench_floor.summarize(dense, [], {"writer": 2.0, "b2b": 1.2})
    assert "### Dense layers, M=1, behind a writer of x" in text
    assert len(_lines(text, "| issue 3: seed 002 M=1 summed, k=4")) == 2


def test_no_seed_sum_without_every_seed_layer() -> None:
    dense = [_dense(n, i, o, 2.0) for n, i, o in SEED_DENSE[:2]]
    text = bench_floor.summarize(dense, [], {"writer": 2.0, "b2b": 1.2})
    assert not _lines(text, "| issue 3: seed 002") and not _lines(text, "| issue 6")
