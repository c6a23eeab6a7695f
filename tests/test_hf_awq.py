"""awq_orin in Hugging Face: AutoAWQ "gemm" checkpoints run on kbit_vllm's awq ops."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from hf_helpers import (  # noqa: E402
    assert_same_checkpoint,
    logits,
    replace_linear_weights,
    save_tiny_llama,
    tokens,
    write_awq_checkpoint,
)
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from kbit_vllm import AwqOrinConfig  # noqa: E402
from kbit_vllm.layers.hf_linear import AwqOrinLinear  # noqa: E402

hf_logging.disable_progress_bar()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    # hidden 128 / intermediate 256 so that group size 128 divides every in_features
    return save_tiny_llama(str(tmp_path_factory.mktemp("llama") / "base"), hidden_size=128, intermediate_size=256,
                           num_attention_heads=4, num_key_value_heads=2)


def awq_layers(model: nn.Module) -> dict[str, AwqOrinLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, AwqOrinLinear)}


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_awq_checkpoint_matches_dequantized_model(base, tmp_path, group_size):
    ckpt = str(tmp_path / f"awq{group_size}")
    dense = write_awq_checkpoint(base, ckpt, group_size)
    model = AutoModelForCausalLM.from_pretrained(ckpt, quantization_config=AwqOrinConfig())
    qc = model.config.quantization_config
    assert isinstance(qc, AwqOrinConfig) and qc.group_size == group_size
    layers = awq_layers(model)
    assert set(layers) == set(dense) and len(layers) == 14
    assert all(m.resident and not hasattr(m, "qweight") for m in layers.values())
    assert isinstance(model.lm_head, nn.Linear)
    ref = replace_linear_weights(AutoModelForCausalLM.from_pretrained(base), dense)
    ids = tokens()
    # dequantized weights are exact (int4 * fp16 scale), the fused CPU int4 matmul reorders sums
    torch.testing.assert_close(logits(model, ids), logits(ref, ids), rtol=1e-3, atol=1e-3)


def test_awq_model_config_route_and_generate(base, tmp_path):
    ckpt = str(tmp_path / "awq")
    dense = write_awq_checkpoint(base, ckpt, 64)
    config = AwqOrinConfig.model_config(ckpt)
    assert config.quantization_config["quant_method"] == "awq_orin"
    model = AutoModelForCausalLM.from_pretrained(ckpt, config=config)
    assert len(awq_layers(model)) == 14
    ref = replace_linear_weights(AutoModelForCausalLM.from_pretrained(base), dense)
    ids = tokens(batch=1, seq=5)
    out = model.generate(ids.to(model.device), max_new_tokens=6, do_sample=False).cpu()
    assert out.shape == (1, 11)
    assert torch.equal(out, ref.generate(ids, max_new_tokens=6, do_sample=False))


def test_awq_fp16_model(base, tmp_path):
    ckpt = str(tmp_path / "awq16")
    dense = write_awq_checkpoint(base, ckpt, 128)
    model = AutoModelForCausalLM.from_pretrained(ckpt, quantization_config=AwqOrinConfig(), dtype=torch.bfloat16)
    ref = replace_linear_weights(AutoModelForCausalLM.from_pretrained(base), dense)
    ids = tokens()
    q, r = logits(model, ids), logits(ref, ids)
    assert float((q - r).norm() / r.norm()) < 0.03  # bf16 activations


def test_awq_skip_list_from_user(base, tmp_path):
    ckpt = str(tmp_path / "awqskip")
    write_awq_checkpoint(base, ckpt, 64, skip=("lm_head", "model.layers.1.mlp.down_proj"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.down_proj.*modules_to_not_convert"):
        AutoModelForCausalLM.from_pretrained(ckpt, quantization_config=AwqOrinConfig())
    model = AutoModelForCausalLM.from_pretrained(
        ckpt, quantization_config=AwqOrinConfig(modules_to_not_convert=["model.layers.1.mlp.down_proj"]))
    assert type(model.model.layers[1].mlp.down_proj) is nn.Linear
    assert torch.isfinite(logits(model, tokens())).all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(bits=8), "only 4-bit"),
    (dict(group_size=256), "group_size must be one of"),
    (dict(version="gemv"), "gemm"),
    (dict(zero_point=False), "zero-point"),
])
def test_bad_awq_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AwqOrinConfig(**kwargs)


def test_awq_checkpoint_config_keys():
    cfg = AwqOrinConfig.from_checkpoint_config({"quant_method": "awq", "w_bit": 4, "q_group_size": 32,
                                                "zero_point": True, "version": "GEMM"})
    assert (cfg.bits, cfg.group_size, cfg.version) == (4, 32, "gemm")


def test_awq_orin_cannot_quantize_float_model(base):
    with pytest.raises(ValueError, match="cannot quantize a float model"):
        AutoModelForCausalLM.from_pretrained(base, quantization_config=AwqOrinConfig())


def test_other_configs_unaffected(base, tmp_path):
    """The awq override only handles AwqOrinConfig; a mismatched built-in config still raises as before."""
    from transformers import GPTQConfig

    ckpt = str(tmp_path / "awq")
    write_awq_checkpoint(base, ckpt, 64)
    with pytest.raises(ValueError, match="AwqConfig but you are passing a GPTQConfig"):
        AutoModelForCausalLM.from_pretrained(ckpt, quantization_config=GPTQConfig(bits=4))


def test_awq_orin_model_resaves_the_checkpoint(base, tmp_path):
    """save_pretrained writes the AutoAWQ checkpoint back (qweight read back from the resident layout):
    the same tensors bit for bit and quant_method "awq"; it reloads to the same model."""
    ckpt = str(tmp_path / "awq")
    write_awq_checkpoint(base, ckpt, 64)
    model = AutoModelForCausalLM.from_pretrained(ckpt, quantization_config=AwqOrinConfig())
    out = str(tmp_path / "resaved")
    model.save_pretrained(out)
    assert_same_checkpoint(ckpt, out)
    reloaded = AutoModelForCausalLM.from_pretrained(out, quantization_config=AwqOrinConfig())
    ids = tokens()
    assert torch.equal(logits(reloaded, ids), logits(model, ids))
