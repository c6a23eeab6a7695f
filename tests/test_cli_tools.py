"""The user tools: quantize (HF folder in, kbit folder out), info, bench's CPU answer and plots, and
the demo end to end on CPU (bundled model -> vllm serve subprocess -> openai client)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from kbit_vllm.cli import main  # noqa: E402
from kbit_vllm.cli._common import bundled_model  # noqa: E402
from kbit_vllm.cli.info import m_ranges  # noqa: E402
from kbit_vllm.cli.quantize import QuantizeReport, quantize_folder  # noqa: E402


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_bundled_model_is_the_trained_one() -> None:
    log = json.loads((bundled_model() / "train_log.json").read_text())
    assert log["result"]["test_ppl_docs"] < 9 and log["result"]["test_ppl_code"] < 10.5
    assert "otherwise" in (bundled_model() / "README.md").read_text()


def test_quantize_cli_output_reloads_in_transformers(tmp_path: Path, capsys) -> None:
    """The folder `quantize` writes reloads as kbit with the logits of an in-memory kbit model."""
    from transformers import AutoModelForCausalLM

    from kbit_vllm import KbitConfig
    from kbit_vllm.layers.hf_linear import KbitLinear

    out = tmp_path / "q3"
    assert main(["quantize", str(bundled_model()), str(out), "--bits", "3",
                 "--modules-to-not-convert", "down_proj"]) == 0
    text = capsys.readouterr().out
    assert "SQNR" in text and "checkpoint weights:" in text and "smaller" in text
    rep = QuantizeReport.load(out)
    assert rep is not None and rep.bits == 3 and len(rep.layers) == 24  # 4 layers x 7 linears, down_proj kept
    assert all(e.sqnr_db is not None and 12 < e.sqnr_db < 18 for e in rep.layers)
    assert rep.bytes_after < rep.bytes_before and rep.linear_bytes_kbit * 4 < rep.linear_bytes_float
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "kbit" and cfg["bits"] == 3 and "down_proj" in cfg["modules_to_not_convert"]
    assert (out / "tokenizer.json").is_file()

    reloaded = AutoModelForCausalLM.from_pretrained(str(out))
    assert sum(isinstance(m, KbitLinear) for m in reloaded.modules()) == 24
    direct = AutoModelForCausalLM.from_pretrained(
        str(bundled_model()), quantization_config=KbitConfig(bits=3, modules_to_not_convert=["down_proj"]),
        dtype=torch.bfloat16)
    ids = torch.randint(1, 4096, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(reloaded, ids), _logits(direct, ids), rtol=0, atol=0)
    # Refuses to overwrite a checkpoint without --force.
    assert main(["quantize", str(bundled_model()), str(out)]) == 2


def test_quantize_cli_lm_head(tmp_path: Path, capsys) -> None:
    """--lm-head quantizes an untied head (listed in the report); the tied bundled model keeps its own."""
    from hf_helpers import save_tiny_llama

    src = save_tiny_llama(str(tmp_path / "untied"))
    assert main(["quantize", src, str(tmp_path / "q"), "--lm-head"]) == 0
    rep = QuantizeReport.load(tmp_path / "q")
    assert rep is not None and "lm_head" in [e.name for e in rep.layers] and "lm_head" not in rep.modules_to_not_convert
    assert json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]["lm_head"] is True
    assert main(["quantize", str(bundled_model()), str(tmp_path / "tied"), "--lm-head"]) == 0
    assert "lm_head" not in [e.name for e in QuantizeReport.load(tmp_path / "tied").layers]


def test_quantize_rejects_non_model_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        quantize_folder(tmp_path, tmp_path / "out", progress=False)


def test_m_ranges_compresses_dispatch() -> None:
    def choose(m: int) -> str:
        return "gemv" if m <= 4 else "mma" if m <= 16 else "dequant"

    assert m_ranges(choose, {"gemv": "G"}) == ["M 1..4: G", "M 5..16: mma", "M >= 17: dequant"]


def test_info_runs(capsys) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "kbit_vllm" in out and "CUDA library" in out and "kernels by M" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU answer")
def test_bench_says_it_needs_a_gpu(capsys) -> None:
    assert main(["bench"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


def test_bench_plot_from(tmp_path: Path) -> None:
    """--plot-from turns the benchmarks' JSON into one PNG per method / k."""
    pytest.importorskip("matplotlib")
    rows = [{"shape": s, "in": 256, "out": 512, "k": 4, "M": m, "gemv": 5.0 * m, "mma": 9.0, "op": 5.0,
             "cublas_fp16": 8.0, "floor": 2.0} for s in ("a", "b") for m in (1, 4, 16)]
    (tmp_path / "bench_kbit.json").write_text(json.dumps({"device": "test", "rows": rows}))
    awq = [{k: v for k, v in r.items() if k != "k"} for r in rows]
    (tmp_path / "bench_awq.json").write_text(json.dumps({"device": "test", "group": 128, "rows": awq}))
    assert main(["bench", "--plot-from", str(tmp_path)]) == 0
    assert (tmp_path / "kbit_k4.png").stat().st_size > 1000 and (tmp_path / "awq_orin.png").is_file()


def test_demo_end_to_end_cpu(tmp_path: Path) -> None:
    """`kbit-vllm demo` as a user runs it: a subprocess that quantizes, serves, asks and prints."""
    pytest.importorskip("vllm")
    pytest.importorskip("openai")
    if torch.cuda.is_available():
        pytest.skip("CPU end-to-end test")
    cmd = [sys.executable, "-m", "kbit_vllm.cli", "demo", "--cache-dir", str(tmp_path), "--max-tokens", "8",
           "--bits", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[4/4] answer:" in r.stdout and "tokens/s" in r.stdout and "bf16 ->" in r.stdout
    last = json.loads((tmp_path / "last_demo.json").read_text())
    assert last["tokens"] == 8 and last["text"].strip() and last["bits"] == 3
    assert last["linear_bytes_kbit"] * 4 < last["linear_bytes_bf16"]
    assert "quantization=kbit" in (tmp_path / "vllm_server.log").read_text() or "bits=3" in (
        tmp_path / "vllm_server.log").read_text()
