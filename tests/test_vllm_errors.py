"""Bad kbit / awq_orin configurations fail with errors that name the layer and the expectation.

Config-level checks run without an engine; layer-level ones start a real engine in a fresh
interpreter, because errors raised in the worker reach the caller only through its output.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import vllm_helpers as H  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def registered() -> None:
    from kbit_vllm.quant_config.vllm_register import register_vllm

    register_vllm()
    register_vllm()  # idempotent


def test_registered_names() -> None:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    from kbit_vllm.quant_config.vllm_awq_orin import AwqOrinConfig
    from kbit_vllm.quant_config.vllm_kbit import KbitConfig

    assert QUANTIZATION_METHODS.count("kbit") == 1 and QUANTIZATION_METHODS.count("awq_orin") == 1
    assert get_quantization_config("kbit") is KbitConfig
    assert get_quantization_config("awq_orin") is AwqOrinConfig


def test_kbit_config_parsing() -> None:
    from kbit_vllm.quant_config.vllm_kbit import KbitConfig

    assert KbitConfig().bits == 4
    c = KbitConfig.from_config({"quant_method": "kbit", "bits": 3, "modules_to_not_convert": ["down_proj"]})
    assert (c.bits, c.modules_to_not_convert) == (3, ["down_proj"])
    for bad in (6, 1, 8):
        with pytest.raises(ValueError, match=r"bits must be one of \(2, 3, 4, 5\)"):
            KbitConfig.from_config({"quant_method": "kbit", "bits": bad})
    with pytest.raises(ValueError, match=r"codebook for bits=2 must have shape \[4\]"):
        KbitConfig(bits=2, codebook=[-1.0, 0.0, 1.0])


def test_kbit_lm_head_on_tied_embeddings_stays_float(tmp_path: Path) -> None:
    """lm_head=true on a float folder: quantized when the head is its own tensor, kept float (the
    flag turned off, with a warning) when the model ties it to the input embeddings."""
    from transformers import LlamaConfig

    from kbit_vllm.quant_config.vllm_kbit import KbitConfig

    for tied in (False, True):
        c = KbitConfig.from_config({"quant_method": "kbit", "bits": 4, "lm_head": True})
        c.maybe_update_config(str(tmp_path), hf_config=LlamaConfig(tie_word_embeddings=tied))
        assert (c.prequantized, c.lm_head) == (False, not tied)
    with pytest.raises(ValueError, match="lm_head must be true or false"):
        KbitConfig.from_config({"quant_method": "kbit", "lm_head": "yes"})


def test_awq_orin_does_not_hijack_awq() -> None:
    from kbit_vllm.quant_config.vllm_awq_orin import AwqOrinConfig

    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    assert AwqOrinConfig.override_quantization_method(awq, "awq_orin") == "awq_orin"
    for user in (None, "awq", "awq_marlin", "kbit"):
        assert AwqOrinConfig.override_quantization_method(awq, user) is None
    assert AwqOrinConfig.override_quantization_method({"quant_method": "gptq"}, "awq_orin") is None
    with pytest.raises(ValueError, match="group_size must be one of"):
        AwqOrinConfig.from_config({**awq, "group_size": 96})
    with pytest.raises(ValueError, match="only 4-bit"):
        AwqOrinConfig.from_config({**awq, "bits": 8})


def test_bits6_fails_in_frontend(tmp_path: Path) -> None:
    """hf_overrides with bits=6 is rejected while the engine config is built, before any worker."""
    cfg, st = H.llama_state(hidden=64, inter=128, layers=1)
    folder = H.save_folder(tmp_path / "m", cfg, st)
    H.set_cpu_env()
    from vllm import LLM

    with pytest.raises(ValueError, match=r"bits must be one of \(2, 3, 4, 5\), got 6"):
        LLM(model=str(folder), quantization="kbit", enforce_eager=True, max_model_len=64,
            hf_overrides={"quantization_config": {"quant_method": "kbit", "bits": 6}})


@pytest.fixture(scope="module")
def odd_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hidden 128 (CPU attention needs head_dim >= 32); intermediate 200: down_proj in_features % 32 != 0."""
    cfg, st = H.llama_state(hidden=128, inter=200, layers=1)
    return H.save_folder(tmp_path_factory.mktemp("odd") / "m", cfg, st)


def test_in_features_not_multiple_of_32_names_layer(odd_model: Path) -> None:
    rc, out = H.run_llm_subprocess(odd_model, quantization="kbit", dtype="bfloat16")
    assert rc != 0
    assert "layer model.layers.0.mlp.down_proj has in_features=200" in out, out[-3000:]
    assert "modules_to_not_convert" in out


def test_in_features_skipped_via_modules_to_not_convert(odd_model: Path) -> None:
    gens = H.run_llm(odd_model, quantization="kbit", dtype="bfloat16", max_tokens=2,
                     hf_overrides={"quantization_config": {"quant_method": "kbit", "bits": 4,
                                                           "modules_to_not_convert": ["down_proj"]}})
    assert all(len(g.ids) == 2 for g in gens)


def test_prequantized_wrong_shape_names_tensor(tmp_path: Path) -> None:
    """A 3-bit checkpoint whose config claims 4 bits: weight_packed has the wrong width."""
    import torch

    cfg, st = H.llama_state(hidden=128, inter=256, layers=1, dtype=torch.float16)
    state = H.kbit_state(st, 3, with_codebook=False)  # codebook in the config instead
    folder = H.save_folder(tmp_path / "m", cfg, state, {"quant_method": "kbit", "bits": 4})
    rc, out = H.run_llm_subprocess(folder, quantization="kbit", dtype="float16")
    assert rc != 0
    pattern = (r"checkpoint tensor model\.layers\.0\.\S+\.weight_packed must have (16|32) columns "
               r"\(in_features/32\*bits = (128|256)/32\*4\), got shape \[\d+, (12|24)\]")
    assert re.search(pattern, out), out[-3000:]
