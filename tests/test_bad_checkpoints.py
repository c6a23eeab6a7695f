"""Corrupt or mismatched checkpoints fail at load with an error naming the tensor (issue #9).

vLLM (an engine in a fresh interpreter, since worker errors reach the caller only through its
output) and Hugging Face loading of kbit folders with a missing tensor, a wrong dtype, a wrong
shape, config bits that disagree with the tensors, a NaN codebook; AutoAWQ folders with NaN / Inf
scales. (E4M4 absmax bytes are all finite by construction: every code decodes to a number.)
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

LAYER = "model.layers.0.self_attn.k_proj"  # inside vLLM's fused qkv_proj


def _mutate(src: Path, dst: Path, fn, config: dict | None = None) -> Path:
    """Copy a checkpoint folder and change its tensors (fn(dict)) and/or its quantization_config."""
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    tensors = load_file(str(f))
    fn(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})
    if config:
        c = json.loads((dst / "config.json").read_text())
        c["quantization_config"].update(config)
        (dst / "config.json").write_text(json.dumps(c))
    return dst


def _set(name: str, value_fn):
    def fn(t: dict[str, torch.Tensor]) -> None:
        t[name] = value_fn(t[name])
    return fn


def _nan_at(idx: int, value: float):
    def f(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x.view(-1)[idx] = value
        return x
    return f


# --- Hugging Face ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_kbit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hf_helpers import save_tiny_llama
    from transformers import AutoModelForCausalLM

    from kbit_vllm import KbitConfig

    d = tmp_path_factory.mktemp("hfk")
    base = save_tiny_llama(str(d / "base"))
    AutoModelForCausalLM.from_pretrained(base, quantization_config=KbitConfig(bits=4)).save_pretrained(d / "k4")
    return d / "k4"


HF_CASES = {
    "absmax_dtype": (_set(f"{LAYER}.weight_absmax", lambda x: x.to(torch.int32)), None,
                     rf"{LAYER}\.weight_absmax has dtype torch\.int32, expected torch\.uint8"),
    "packed_dtype": (_set(f"{LAYER}.weight_packed", lambda x: x.to(torch.float32)), None,
                     rf"{LAYER}\.weight_packed has dtype torch\.float32, expected torch\.int32"),
    "absmax_shape": (_set(f"{LAYER}.weight_absmax", lambda x: x[:, :-1].contiguous()), None,
                     rf"{LAYER}\.weight_absmax has shape \[32, 1\], expected \[32, 2\]"),
    "bits_disagree": (lambda t: None, {"bits": 3},
                      r"weight_packed has shape \[\d+, \d+\], expected \[\d+, \d+\] for bits=3 "
                      r"\(the tensor holds bits=4; the config.s bits disagree\)"),
    "codebook_nan": (_set(f"{LAYER}.codebook", _nan_at(3, float("nan"))), None,
                     rf"{LAYER}\.codebook holds NaN or Inf"),
    "codebook_shape": (_set(f"{LAYER}.codebook", lambda x: x[:8].contiguous()), None,
                       rf"{LAYER}\.codebook has shape \[8\], expected \[16\]"),
}


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_hf_kbit_bad_checkpoint(hf_kbit: Path, tmp_path: Path, case: str) -> None:
    from transformers import AutoModelForCausalLM

    fn, cfg, pattern = HF_CASES[case]
    bad = _mutate(hf_kbit, tmp_path / case, fn, cfg)
    with pytest.raises(ValueError, match=pattern):
        AutoModelForCausalLM.from_pretrained(str(bad))


@pytest.fixture(scope="module")
def hf_awq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hf_helpers import save_tiny_llama, write_awq_checkpoint

    d = tmp_path_factory.mktemp("hfa")
    base = save_tiny_llama(str(d / "base"))
    write_awq_checkpoint(base, str(d / "awq"), 32)
    return d / "awq"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_hf_awq_nonfinite_scales(hf_awq: Path, tmp_path: Path, value: float) -> None:
    from transformers import AutoModelForCausalLM

    from kbit_vllm import AwqOrinConfig

    bad = _mutate(hf_awq, tmp_path / "bad", _set(f"{LAYER}.scales", _nan_at(5, value)))
    with pytest.raises(ValueError, match=rf"{LAYER}\.scales holds NaN or Inf"):
        AutoModelForCausalLM.from_pretrained(str(bad), quantization_config=AwqOrinConfig())


def test_hf_awq_wrong_shape(hf_awq: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from kbit_vllm import AwqOrinConfig

    bad = _mutate(hf_awq, tmp_path / "bad", _set(f"{LAYER}.qzeros", lambda x: x[:-1].contiguous()))
    with pytest.raises(ValueError, match=rf"{LAYER}\.qzeros has shape \[\d+, \d+\], expected"):
        AutoModelForCausalLM.from_pretrained(str(bad), quantization_config=AwqOrinConfig())


# --- vLLM -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_kbit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("vllm")
    import vllm_helpers as H

    cfg, st = H.llama_state(hidden=128, inter=256, layers=1, dtype=torch.float16)
    return H.save_folder(tmp_path_factory.mktemp("vk") / "m", cfg, H.kbit_state(st, 4),
                         {"quant_method": "kbit", "bits": 4})


def _vllm_fails(folder: Path, pattern: str, **kw) -> None:
    import vllm_helpers as H

    rc, out = H.run_llm_subprocess(folder, dtype="float16", **kw)
    assert rc != 0
    assert re.search(pattern, out), out[-3000:]


def test_vllm_kbit_missing_tensor(vllm_kbit: Path, tmp_path: Path) -> None:
    bad = _mutate(vllm_kbit, tmp_path / "bad", lambda t: t.pop(f"{LAYER}.weight_absmax"))
    _vllm_fails(bad, rf"checkpoint tensor\(s\) {LAYER}\.weight_absmax missing from the checkpoint",
                quantization="kbit")


def test_vllm_kbit_nan_codebook_and_wrong_dtype(vllm_kbit: Path, tmp_path: Path) -> None:
    bad = _mutate(vllm_kbit, tmp_path / "nan", _set(f"{LAYER}.codebook", _nan_at(0, float("inf"))))
    _vllm_fails(bad, rf"checkpoint tensor {LAYER}\.codebook must hold finite floats", quantization="kbit")
    bad = _mutate(vllm_kbit, tmp_path / "dtype", _set("model.layers.0.mlp.up_proj.weight_absmax",
                                                       lambda x: x.to(torch.int16)))
    _vllm_fails(bad, r"checkpoint tensor model\.layers\.0\.mlp\.up_proj\.weight_absmax must have dtype "
                     r"torch\.uint8, got torch\.int16", quantization="kbit")


def test_vllm_awq_nan_scales(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    import vllm_helpers as H

    cfg, st = H.llama_state(hidden=128, inter=256, layers=1, dtype=torch.float16)
    state = H.awq_state(st, 64)
    state[f"{LAYER}.scales"] = _nan_at(7, float("nan"))(state[f"{LAYER}.scales"])
    folder = H.save_folder(tmp_path / "m", cfg, state, {"quant_method": "awq", "bits": 4, "group_size": 64,
                                                        "zero_point": True, "version": "gemm"})
    _vllm_fails(folder, rf"checkpoint tensor {LAYER}\.scales holds NaN or Inf", quantization="awq_orin")
