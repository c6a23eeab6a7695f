"""kbit on a tiny Mixtral: dense linears are quantized, fused 3-D experts stay in the model dtype (logged)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from hf_helpers import logits, replace_linear_weights, save_tiny_mixtral, tokens  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from kbit_vllm import KbitConfig  # noqa: E402
from kbit_vllm.layers.hf_linear import KbitLinear  # noqa: E402

hf_logging.disable_progress_bar()


def test_mixtral_experts_left_unquantized(tmp_path, caplog):
    base = save_tiny_mixtral(str(tmp_path / "mixtral"))
    with caplog.at_level(logging.WARNING, logger="kbit_vllm"):
        model = AutoModelForCausalLM.from_pretrained(base, quantization_config=KbitConfig(bits=4))
    assert any("fused MoE expert modules" in r.getMessage() and "not quantized" in r.getMessage()
               for r in caplog.records)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, KbitLinear)}
    assert len(layers) == 2 * 4  # q/k/v/o per layer
    experts = model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.dim() == 3 and experts.gate_up_proj.dtype == torch.float32

    dense = {n: m.dequantize(torch.float32) for n, m in layers.items()}
    ref = replace_linear_weights(AutoModelForCausalLM.from_pretrained(base), dense)
    ids = tokens()
    q = logits(model, ids)
    torch.testing.assert_close(q, logits(ref, ids), rtol=1e-5, atol=1e-5)

    out = str(tmp_path / "mixtral_kbit")
    model.save_pretrained(out)
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(reloaded.model.layers[1].self_attn.v_proj, KbitLinear)
    assert isinstance(reloaded.model.layers[1].mlp.experts, nn.Module)
    assert torch.equal(logits(reloaded, ids), q)
