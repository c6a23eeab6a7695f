"""kbit on transformers 5.x MoE models: the fused 3-D experts are quantized (KbitExperts).

Each quantized model is compared with the float model holding the same weights dequantized:
same math, same fp32 GEMMs, only the experts' summation order differs, so logits agree to
1e-5. Saving writes per-expert tensors (the checkpoint's own names + `_packed` / `_absmax`),
which reload bit-exactly.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("transformers")

from hf_helpers import logits, save_tiny_mixtral, save_tiny_qwen3_moe, tokens  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from kbit_vllm import KbitConfig  # noqa: E402
from kbit_vllm.layers.hf_linear import KbitLinear  # noqa: E402
from kbit_vllm.layers.hf_moe import KbitExperts  # noqa: E402

hf_logging.disable_progress_bar()


def dequantized_reference(base: str, model: torch.nn.Module) -> torch.nn.Module:
    """The float model at base, with every kbit linear / experts weight replaced by its dequantized value."""
    ref = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, KbitLinear):
                ref.get_submodule(name).weight.copy_(m.dequantize(torch.float32))
            elif isinstance(m, KbitExperts):
                target = ref.get_submodule(name)
                for proj, w in m.dequantize(torch.float32).items():
                    getattr(target, proj).copy_(w)
    return ref


def safetensor_names(folder: str) -> dict[str, list[int]]:
    with safe_open(f"{folder}/model.safetensors", framework="pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.mark.parametrize(("maker", "bits", "expert_names"), [
    (save_tiny_mixtral, 4, ("block_sparse_moe.experts.3.w1", "block_sparse_moe.experts.3.w3",
                            "block_sparse_moe.experts.3.w2")),
    (save_tiny_qwen3_moe, 3, ("mlp.experts.7.gate_proj", "mlp.experts.7.up_proj", "mlp.experts.7.down_proj")),
])
def test_experts_quantize_save_reload(tmp_path, maker, bits: int, expert_names: tuple[str, ...]) -> None:
    base = maker(str(tmp_path / "base"))
    model = AutoModelForCausalLM.from_pretrained(base, quantization_config=KbitConfig(bits=bits))
    experts = {n: m for n, m in model.named_modules() if isinstance(m, KbitExperts)}
    assert len(experts) == 2 and all(m.resident and m.bits == bits for m in experts.values())
    assert not any(p.dim() == 3 and p.is_floating_point() for p in model.parameters())  # no float experts left

    ids = tokens()
    q = logits(model, ids)
    ref = logits(dequantized_reference(base, model), ids)
    torch.testing.assert_close(q, ref, rtol=1e-5, atol=1e-5)
    plain = logits(AutoModelForCausalLM.from_pretrained(base), ids)
    assert (plain - q).abs().max() > 1e-3  # the experts really are quantized (the check can fail)

    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    names = safetensor_names(out)
    m0 = next(iter(experts.values()))
    gate, up, down = (f"model.layers.1.{n}" for n in expert_names)
    assert names[f"{gate}.weight_packed"] == [m0.intermediate_dim, m0.hidden_dim // 32 * bits]
    assert names[f"{up}.weight_absmax"] == [m0.intermediate_dim, m0.hidden_dim // 32]
    assert names[f"{down}.weight_packed"] == [m0.hidden_dim, m0.intermediate_dim // 32 * bits]
    assert not any(n.endswith(("gate_up_proj_packed", "down_proj_packed", ".gate_up_proj")) for n in names)

    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(reloaded.get_submodule(next(iter(experts))), KbitExperts)
    sd_a, sd_b = model.state_dict(), reloaded.state_dict()
    assert sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert torch.equal(logits(reloaded, ids), q)

    again = str(tmp_path / "saved_again")  # reload -> save gives the same tensors
    reloaded.save_pretrained(again)
    assert safetensor_names(again) == names


def test_experts_skipped_stay_float(tmp_path, caplog) -> None:
    base = save_tiny_mixtral(str(tmp_path / "base"))
    with caplog.at_level(logging.WARNING, logger="kbit_vllm"):
        model = AutoModelForCausalLM.from_pretrained(
            base, quantization_config=KbitConfig(bits=4, modules_to_not_convert=["model.layers.0.mlp.experts"]))
    assert isinstance(model.model.layers[1].mlp.experts, KbitExperts)
    assert model.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.float32
    assert any("fused MoE expert modules" in r.getMessage() for r in caplog.records)


def test_experts_bad_intermediate_names_layer(tmp_path) -> None:
    base = save_tiny_mixtral(str(tmp_path / "base"), intermediate=80)
    with pytest.raises(ValueError, match=r"kbit: MoE layer model\.layers\.0\.mlp\.experts: intermediate size 80 "
                                         r"is not a multiple of 32"):
        AutoModelForCausalLM.from_pretrained(base, quantization_config=KbitConfig(bits=4))


def test_experts_missing_in_checkpoint_names_layer(tmp_path) -> None:
    """A kbit folder that lacks one layer's expert tensors fails to load, naming that layer."""
    from safetensors.torch import load_file, save_file

    base = save_tiny_mixtral(str(tmp_path / "base"))
    out = str(tmp_path / "saved")
    AutoModelForCausalLM.from_pretrained(base, quantization_config=KbitConfig(bits=2)).save_pretrained(out)
    sd = load_file(f"{out}/model.safetensors")
    dropped = {k: v for k, v in sd.items() if ".layers.1.block_sparse_moe.experts." not in k}
    save_file(dropped, f"{out}/model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"MoE experts 'model\.layers\.1\.mlp\.experts' are missing"):
        AutoModelForCausalLM.from_pretrained(out)
