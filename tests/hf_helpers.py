"""Tiny models built on the spot for the Hugging Face integration tests (no hub access)."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file
from torch import nn

HIDDEN = 64
INTER = 128
VOCAB = 128


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    kw = dict(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kw.update(overrides)
    return LlamaConfig(**kw)


def save_tiny_llama(path: str, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> str:
    """Random-init tiny Llama saved with save_pretrained; Linear weights get a realistic spread."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(**overrides)).to(dtype)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, 0.08)
    model.save_pretrained(path)
    return path


def tokens(batch: int = 2, seq: int = 12, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, seq), generator=g)


@torch.no_grad()
def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits on CPU, whatever device the model was loaded on."""
    return model(input_ids=ids.to(model.device)).logits.float().cpu()


def replace_linear_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> nn.Module:
    """Load dense weights {module_name: W [out, in]} into a float model's nn.Linear layers."""
    with torch.no_grad():
        for name, w in weights.items():
            lin = model.get_submodule(name)
            assert isinstance(lin, nn.Linear), name
            lin.weight.copy_(w.to(lin.weight.dtype))
    return model


def write_awq_checkpoint(src: str, dst: str, group_size: int = 64,
                         skip: tuple[str, ...] = ("lm_head",)) -> dict[str, torch.Tensor]:
    """AutoAWQ-style "gemm" checkpoint of the model at src (RTN int4); returns the dequantized weights
    {checkpoint module name: W [out, in] fp32}. MoE experts are quantized per expert under the
    checkpoint's per-expert names; routers (`...gate`, `...router`) stay float, as AutoAWQ keeps them,
    and so do the modules named in skip and everything under them."""
    from safetensors.torch import load_file

    from kbit_vllm.formats import dequantize_awq, quantize_awq_rtn

    os.makedirs(dst, exist_ok=True)
    sd = load_file(os.path.join(src, "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    for key, t in sd.items():
        mod = key.rsplit(".", 1)[0]
        router = mod.rsplit(".", 1)[-1] in ("gate", "router")
        skipped = any(mod == s or mod.startswith(s + ".") for s in skip)
        if key.endswith(".weight") and t.dim() == 2 and "embed" not in key and not skipped and not router:
            qweight, qzeros, scales = quantize_awq_rtn(t, group_size)
            out[mod + ".qweight"], out[mod + ".qzeros"], out[mod + ".scales"] = qweight, qzeros, scales
            dense[mod] = dequantize_awq(qweight, qzeros, scales, group_size, torch.float32)
        else:
            out[key] = t
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                                  "version": "gemm", "modules_to_not_convert": None}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return dense


def assert_same_checkpoint(a: str, b: str) -> None:
    """Two folders hold the same model.safetensors (names, dtypes, bits) and quantization_config."""
    from safetensors.torch import load_file

    ta, tb = load_file(os.path.join(a, "model.safetensors")), load_file(os.path.join(b, "model.safetensors"))
    assert ta.keys() == tb.keys(), sorted(ta.keys() ^ tb.keys())[:8]
    differ = [k for k in ta if ta[k].dtype != tb[k].dtype or not torch.equal(ta[k], tb[k])]
    assert not differ, differ[:8]
    with open(os.path.join(a, "config.json")) as fa, open(os.path.join(b, "config.json")) as fb:
        assert json.load(fa)["quantization_config"] == json.load(fb)["quantization_config"]


def save_with_weights(src: str, dst: str, weights: dict[str, torch.Tensor]) -> str:
    """A copy of the float folder at src with `<module>.weight` replaced by weights[module] (checkpoint
    names, e.g. write_awq_checkpoint's dequantized weights): the reference model for a quantized one."""
    import shutil

    from safetensors.torch import load_file

    shutil.copytree(src, dst)
    sd = load_file(os.path.join(src, "model.safetensors"))
    for mod, w in weights.items():
        sd[mod + ".weight"] = w.to(sd[mod + ".weight"].dtype).contiguous()
    save_file(sd, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst


def _randomize_and_save(model: torch.nn.Module, path: str) -> str:
    """Redraw every matrix from N(0, 0.08), then save the folder (shared by the tiny MoE builders)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(path)
    return path


def save_tiny_mixtral(path: str, seed: int = 0, intermediate: int = INTER, hidden: int = HIDDEN) -> str:
    """Random-init tiny Mixtral (4 experts, top-2): transformers 5.x fuses experts into 3-D params."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    cfg = MixtralConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, num_local_experts=4,
                        num_experts_per_tok=2, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                        pad_token_id=0)
    model = MixtralForCausalLM(cfg)
    return _randomize_and_save(model, path)


def save_tiny_qwen3_moe(path: str, seed: int = 0, moe_intermediate: int = 64) -> str:
    """Random-init tiny Qwen3-MoE (8 experts, top-2, renormalized): fused 3-D experts in transformers 5.x."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(hidden_size=HIDDEN, intermediate_size=INTER, moe_intermediate_size=moe_intermediate,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         vocab_size=VOCAB, max_position_embeddings=64, num_experts=8, num_experts_per_tok=2,
                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = Qwen3MoeForCausalLM(cfg)
    return _randomize_and_save(model, path)
