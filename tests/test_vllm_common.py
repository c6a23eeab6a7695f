"""The unquantized-layer matcher shared by the vLLM configs (no engine needed)."""

from __future__ import annotations

import pytest

from kbit_vllm.quant_config.vllm_common import layer_skipped

MAPPING = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def test_substring_and_exact() -> None:
    assert layer_skipped("model.layers.0.mlp.down_proj", ["down_proj"], MAPPING, exact=False)
    assert not layer_skipped("model.layers.0.mlp.down_proj", ["up_proj"], MAPPING, exact=False)
    assert layer_skipped("model.layers.1.mlp.down_proj", ["model.layers.1.mlp.down_proj"], MAPPING, exact=True)
    assert not layer_skipped("model.layers.1.mlp.down_proj", ["layers.1.mlp.down_proj"], MAPPING, exact=True)
    assert not layer_skipped("model.layers.1.mlp.down_proj", [], MAPPING, exact=False)


def test_fused_layers_follow_their_shards() -> None:
    assert layer_skipped("model.layers.0.self_attn.qkv_proj", ["self_attn"], MAPPING, exact=False)
    names = [f"model.layers.0.mlp.{s}" for s in ("gate_proj", "up_proj")]
    assert layer_skipped("model.layers.0.mlp.gate_up_proj", names, MAPPING, exact=True)
    assert not layer_skipped("model.layers.1.mlp.gate_up_proj", names, MAPPING, exact=True)
    with pytest.raises(ValueError, match="fused shards are partly unquantized"):
        layer_skipped("model.layers.0.self_attn.qkv_proj", ["q_proj"], MAPPING, exact=False)
