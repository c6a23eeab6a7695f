"""benchmarks/ab_libs.py, the A/B harness for library builds: its argument parsing and the table it
prints run on any machine; the timing itself needs a GPU (run on the device). Also the agreement
summary of benchmarks/vllm_gpu_e2e.py (its engines need the GPU and the vLLM bundle)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import ab_libs  # noqa: E402


def test_parse_libs_and_shapes() -> None:
    assert ab_libs.parse_libs("base=/a.so, new=b.so") == [("base", "/a.so"), ("new", "b.so")]
    for bad in ("base", "=x.so", "a=x.so,a=y.so", ""):
        with pytest.raises(ValueError, match="--libs"):
            ab_libs.parse_libs(bad)
    assert ab_libs.parse_shapes("4096x28672,14336x4096") == [(4096, 28672), (14336, 4096)]
    for bad in ("4096", "4001x10", "ax8"):
        with pytest.raises(ValueError, match="--shapes"):
            ab_libs.parse_shapes(bad)


def test_summarize_rows_rounds_and_ratios() -> None:
    rec = [
        {"lib": "base", "shape": "4096x28672", "k": 4, "m": 16, "path": "wgmma", "us": 35.0, "err": 3e-3},
        {"lib": "new", "shape": "4096x28672", "k": 4, "m": 16, "path": "wgmma", "us": 33.0, "err": 4e-3},
        {"lib": "base", "shape": "4096x28672", "k": 4, "m": 16, "path": "wgmma", "us": 36.0, "err": 3e-3},
        {"lib": "new", "shape": "4096x28672", "k": 4, "m": 16, "path": "wgmma", "us": 33.4, "err": 3e-3},
        {"lib": "base", "shape": "4096x6144", "k": 2, "m": 32, "path": "op", "us": 10.0, "err": 1e-3},
    ]
    lines = ab_libs.summarize(rec, ["base", "new"]).splitlines()
    assert lines[0].startswith("| layer | k | M | path | base µs | new µs | new / base |")
    assert len(lines) == 4  # header, rule, two rows in first-seen order
    assert "| 4096x28672 | 4 | 16 | wgmma | 35.00 / 36.00 | 33.00 / 33.40 | 0.935 | 4.0e-03 |" == lines[2]
    assert lines[3] == "| 4096x6144 | 2 | 32 | op | 10.00 | - | - | 1.0e-03 |"  # a library with no time


def test_summarize_keeps_a_nan_error_visible() -> None:
    """A NaN output (err NaN) in any round shows as inf in the row's error, whatever its position:
    max(0.0, nan) is 0.0 in Python, which hid a broken build's NaNs once (session 41)."""
    for errs in ((0.0, float("nan")), (float("nan"), 0.0)):
        rec = [{"lib": "new", "shape": "768x2048", "k": 4, "m": 64, "path": "op", "us": 56.0, "err": e} for e in errs]
        assert ab_libs.summarize(rec, ["new"]).splitlines()[2].endswith("| inf |")


def test_parent_reports_a_failed_child(tmp_path: Path) -> None:
    """A library that cannot run (here not a library at all) ends in a message and an empty table,
    not a traceback of the parent."""
    fake = tmp_path / "not_a_lib.so"
    fake.write_bytes(b"\0")
    out = subprocess.run([sys.executable, str(BENCH / "ab_libs.py"), "--libs", f"x={fake}", "--rounds", "1",
                          "--shapes", "64x64", "--timeout", "120"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "# round 1: x" in out.stdout and "# x: exit 1" in out.stdout
    assert "ab_libs: library x: CUDA library not loaded" in out.stdout
    assert out.stdout.rstrip().endswith("|---|---|---|---|---|---|")
    bad = subprocess.run([sys.executable, str(BENCH / "ab_libs.py"), "--libs", f"x={tmp_path / 'missing.so'}"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "is not a file" in bad.stderr
    moe = subprocess.run([sys.executable, str(BENCH / "ab_libs.py"), "--libs", f"x={fake}", "--moe", "qwen7"],
                         capture_output=True, text=True, timeout=120)
    assert moe.returncode == 2 and "unknown scenarios ['qwen7']" in moe.stderr


def test_budget_skips_children_past_it(tmp_path: Path) -> None:
    """--budget: a child that would start past the run's time is skipped with a line saying so and
    the (empty) table still prints, so an outer time limit does not lose the summary."""
    fake = tmp_path / "not_a_lib.so"
    fake.write_bytes(b"\0")
    out = subprocess.run([sys.executable, str(BENCH / "ab_libs.py"), "--libs", f"a={fake},b={fake}", "--rounds", "2",
                          "--shapes", "64x64", "--budget", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for rnd in (1, 2):
        for name in ("a", "b"):
            assert f"# round {rnd}: {name} skipped (--budget 0 s spent)" in out.stdout
    assert "exit 1" not in out.stdout  # no child ran
    assert out.stdout.rstrip().endswith("|---|---|---|---|---|---|---|---|")


def e2e_module():
    """benchmarks/vllm_gpu_e2e.py imported with the environment it sets for its engines undone, so
    that this process's later vLLM tests do not inherit it."""
    saved = dict(os.environ)
    try:
        return importlib.import_module("vllm_gpu_e2e")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_e2e_agreement_pairs_and_counts() -> None:
    """AGREE pairs kbit / pre runs with the deq run of the same bits and awq_orin with awq (tiny models
    only), counts prompts whose greedy tokens match, and takes the logprob difference only over each
    prompt's leading equal tokens (after the first different token the two continue different texts)."""
    e2e = e2e_module()
    assert e2e.reference_of("tiny_kbit4") == "tiny_deq4"
    assert e2e.reference_of("tinymoe_pre2") == "tinymoe_deq2"
    assert e2e.reference_of("tinymoe_awq_orin") == "tinymoe_awq"
    assert e2e.reference_of("tiny_kbit4h") is None and e2e.reference_of("l3_kbit4") is None
    assert e2e.reference_of("tiny_bf16") is None and e2e.reference_of("tiny_deq4") is None
    ref = {"name": "tiny_deq4", "outputs": [[[1, 2, 3], [-0.5, -1.0, -2.0]], [[4, 5, 6], [-0.1, -0.2, -0.3]]]}
    run = {"name": "tiny_kbit4", "tp": 2,
           "outputs": [[[1, 2, 3], [-0.52, -1.1, -2.0]], [[4, 9, 6], [-0.1, -5.0, -9.0]]]}
    lines = e2e.agreement({"tiny_deq4": ref, "tiny_kbit4": run, "tiny_bf16": {"name": "tiny_bf16"}})
    assert len(lines) == 1
    assert lines[0].startswith("AGREE tiny_kbit4 vs tiny_deq4: 1/2 prompts with the same greedy tokens")
    assert "max |logprob diff| 0.1000 over equal tokens (tp=2)" in lines[0]
    assert e2e.agreement({"tiny_kbit4": run}) == []  # its reference did not run
