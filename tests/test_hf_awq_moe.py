"""awq_orin on transformers 5.x MoE models: AutoAWQ per-expert tensors load into AwqOrinExperts.

AutoAWQ checkpoints of a tiny Mixtral (4 experts, hidden 128, group 128; transformers renames its
`block_sparse_moe` to `mlp`) and a tiny Qwen3-MoE (8 experts, hidden 64, group 32) are written with
the RTN packer. Each loaded model is compared with the float model holding the same weights
dequantized in fp32 (exactly: int4 times an fp16 scale), so only the summation order differs and
logits agree to 1e-4 (plain float experts differ by > 0.1). Saving writes the AutoAWQ checkpoint
back bit for bit, per-expert names included.
"""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("transformers")

from hf_helpers import (  # noqa: E402
    assert_same_checkpoint,
    logits,
    save_tiny_mixtral,
    save_tiny_qwen3_moe,
    save_with_weights,
    tokens,
    write_awq_checkpoint,
)
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from kbit_vllm import AwqOrinConfig  # noqa: E402
from kbit_vllm.layers.hf_awq_moe import AwqOrinExperts  # noqa: E402
from kbit_vllm.layers.hf_linear import AwqOrinLinear  # noqa: E402

hf_logging.disable_progress_bar()

MODELS = {  # kind -> (builder, group size, checkpoint prefix of layer 1's experts)
    "mixtral": (lambda p: save_tiny_mixtral(p, hidden=128), 128, "model.layers.1.block_sparse_moe.experts"),
    "qwen3_moe": (save_tiny_qwen3_moe, 32, "model.layers.1.mlp.experts"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, str]]:
    """kind -> (float base, AutoAWQ checkpoint, float reference holding the dequantized weights)."""
    out = {}
    for kind, (build, group, _) in MODELS.items():
        root = tmp_path_factory.mktemp(kind)
        base = build(str(root / "base"))
        dense = write_awq_checkpoint(base, str(root / "awq"), group)
        out[kind] = (base, str(root / "awq"), save_with_weights(base, str(root / "ref"), dense))
    return out


def load(path: str, **kwargs) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, quantization_config=AwqOrinConfig(**kwargs))


def experts_of(model: torch.nn.Module) -> dict[str, AwqOrinExperts]:
    return {n: m for n, m in model.named_modules() if isinstance(m, AwqOrinExperts)}


def mutate(src: str, dst, change) -> str:
    """A copy of the checkpoint folder at src whose tensors went through change(dict) -> dict."""
    import shutil

    shutil.copytree(src, dst)
    save_file(change(load_file(f"{dst}/model.safetensors")), f"{dst}/model.safetensors", metadata={"format": "pt"})
    return str(dst)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_awq_moe_matches_dequantized_generates_and_resaves(folders, tmp_path, kind: str) -> None:
    base, awq, ref_dir = folders[kind]
    model = load(awq)
    experts = experts_of(model)
    assert sorted(experts) == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert all(m.resident and m.group_size == MODELS[kind][1] for m in experts.values())
    assert len([m for m in model.modules() if isinstance(m, AwqOrinLinear)]) == 8  # q/k/v/o of both layers
    base_sd = load_file(f"{base}/model.safetensors")
    router = model.model.layers[1].mlp.gate  # routers stay float, untouched
    assert torch.equal(router.weight.cpu(), base_sd[f"{MODELS[kind][2].rpartition('.')[0]}.gate.weight"])

    ref = AutoModelForCausalLM.from_pretrained(ref_dir)
    ids = tokens()
    q = logits(model, ids)
    torch.testing.assert_close(q, logits(ref, ids), rtol=1e-4, atol=1e-4)
    assert (logits(AutoModelForCausalLM.from_pretrained(base), ids) - q).abs().max() > 0.1  # really quantized

    prompt = tokens(batch=1, seq=5)
    out = model.generate(prompt.to(model.device), max_new_tokens=6, do_sample=False).cpu()  # (cuda when a GPU is)
    assert out.shape == (1, 11) and torch.equal(out, ref.generate(prompt, max_new_tokens=6, do_sample=False))

    saved = str(tmp_path / "saved")
    model.save_pretrained(saved)
    assert_same_checkpoint(awq, saved)  # per-expert qweight / qzeros / scales under the checkpoint's names
    reloaded = load(saved)
    sd_a, sd_b = model.state_dict(), reloaded.state_dict()
    assert sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert torch.equal(logits(reloaded, ids), q)


def test_awq_moe_float_experts_need_modules_to_not_convert(folders, tmp_path) -> None:
    """Layer 0's experts stored float: named in the error, and kept float when listed."""
    base, _, _ = folders["mixtral"]
    awq = str(tmp_path / "awq")
    dense = write_awq_checkpoint(base, awq, 64, skip=("lm_head", "model.layers.0.block_sparse_moe.experts"))
    with pytest.raises(ValueError, match=r"awq_orin: MoE experts 'model\.layers\.0\.mlp\.experts' are missing "
                                         r"\['gate_up_proj_qweight'.*modules_to_not_convert"):
        load(awq)
    model = load(awq, modules_to_not_convert=["model.layers.0.mlp.experts"])
    assert sorted(experts_of(model)) == ["model.layers.1.mlp.experts"]
    assert model.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.float32
    ref = AutoModelForCausalLM.from_pretrained(save_with_weights(base, str(tmp_path / "ref"), dense))
    ids = tokens()
    torch.testing.assert_close(logits(model, ids), logits(ref, ids), rtol=1e-4, atol=1e-4)
    saved = str(tmp_path / "saved")
    model.save_pretrained(saved)  # float experts split back to w1/w2/w3.weight, AWQ ones to qweight...
    with open(f"{saved}/config.json") as f:
        assert '"model.layers.0.mlp.experts"' in f.read()
    assert load_file(f"{saved}/model.safetensors").keys() == load_file(f"{awq}/model.safetensors").keys()


def _drop(key: str):
    return lambda sd: {k: v for k, v in sd.items() if k != key}


def _truncate(key: str):
    return lambda sd: {**sd, key: sd[key][:-1].contiguous()}


@pytest.mark.parametrize(("kind", "change", "message"), [
    ("mixtral", _drop("model.layers.1.block_sparse_moe.experts.2.w3.qzeros"),
     r"awq_orin: checkpoint tensor model.layers.1.block_sparse_moe.experts.2.w3.qzeros is missing "
     r"(MoE experts 'model.layers.1.mlp.experts', projection w3, expert 2); expected torch.int32 [1, 16]"),
    ("qwen3_moe", _truncate("model.layers.0.mlp.experts.5.down_proj.scales"),
     r"awq_orin: checkpoint tensor model.layers.0.mlp.experts.5.down_proj.scales has shape [1, 64], expected "
     r"[2, 64] (MoE experts 'model.layers.0.mlp.experts', projection down_proj, expert 5)"),
])
def test_awq_moe_bad_expert_tensor_named_before_loading(folders, tmp_path, kind: str, change, message: str) -> None:
    bad = mutate(folders[kind][1], tmp_path / "bad", change)
    with pytest.raises(ValueError, match=re.escape(message)):
        load(bad)


def test_awq_moe_nonfinite_scale_names_expert(folders, tmp_path) -> None:
    key = "model.layers.1.mlp.experts.3.up_proj.scales"

    def poison(sd):
        sd[key][1, 7] = float("nan")
        return sd

    bad = mutate(folders["qwen3_moe"][1], tmp_path / "nan", poison)
    with pytest.raises(ValueError, match=r"awq_orin: MoE layer model\.layers\.1\.mlp\.experts: checkpoint scales of "
                                         r"gate_up_proj \(expert 3\) hold NaN or Inf \(first at \[group, column\] "
                                         r"\[1, 71\]\)"):
        load(bad)
