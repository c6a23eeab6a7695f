"""Hugging Face integration of kbit: on-the-fly quantization, exactness, save/reload, skips, errors."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from hf_helpers import logits, replace_linear_weights, save_tiny_llama, tokens  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from kbit_vllm import KbitConfig  # noqa: E402
from kbit_vllm.formats import normal_float_codebook  # noqa: E402
from kbit_vllm.layers.hf_linear import KbitLinear  # noqa: E402

hf_logging.disable_progress_bar()

# Per-k bounds. Weight level: relative RMS error of normal-float k-bit blockwise (32) quantization
# of Gaussian weights, measured 0.42 / 0.18 / 0.092 / 0.054 for k = 2..5 (about halving per bit,
# as expected for a 2^k-level quantizer). Logits of this random 2-layer Llama amplify the weight
# error about 2.2-2.9x (errors of q/k/v/o and of gate*up compound, lm_head unquantized), so the
# logits bound is ~3.2x the weight bound with margin; both must also decrease strictly with k.
WEIGHT_BOUND = {2: 0.45, 3: 0.20, 4: 0.10, 5: 0.06}
LOGIT_BOUND = {2: 1.25, 3: 0.60, 4: 0.32, 5: 0.20}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return save_tiny_llama(str(tmp_path_factory.mktemp("llama") / "base"))


@pytest.fixture(scope="module")
def ref_logits(base) -> torch.Tensor:
    return logits(AutoModelForCausalLM.from_pretrained(base), tokens())


def load_kbit(path: str, **cfg) -> nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, quantization_config=KbitConfig(**cfg))


def kbit_layers(model: nn.Module) -> dict[str, KbitLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, KbitLinear)}


def dequantized_reference(base: str, model: nn.Module) -> nn.Module:
    """The float model whose Linear weights are the kbit model's dequantized weights."""
    dense = {n: m.dequantize(torch.float32) for n, m in kbit_layers(model).items()}
    return replace_linear_weights(AutoModelForCausalLM.from_pretrained(base), dense)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    return float((a - b).norm() / b.norm())


# --- config ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(bits=6), "bits must be one of"),
    (dict(bits=1), "bits must be one of"),
    (dict(bits=True), "bits must be one of"),
    (dict(bits=4, blocksize=64), "blocksize must be 32"),
    (dict(bits=2, codebook=[0.0, 1.0]), "needs 4 values"),
    (dict(bits=2, codebook=[-2.0, 0.0, 0.5, 1.0]), "within"),
    (dict(modules_to_not_convert="lm_head"), "list of module names"),
    (dict(lm_head="yes"), "lm_head must be true or false"),
])
def test_bad_config_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KbitConfig(**kwargs)


def test_config_roundtrip():
    cfg = KbitConfig(bits=3, modules_to_not_convert=["lm_head"])
    d = cfg.to_dict()
    assert d == {"quant_method": "kbit", "bits": 3, "blocksize": 32, "modules_to_not_convert": ["lm_head"]}
    assert KbitConfig.from_dict(d) == cfg
    assert KbitConfig(bits=3) != KbitConfig(bits=5)
    assert json.loads(json.dumps(KbitConfig(bits=2, codebook=[-1, -0.25, 0.25, 1]).to_dict()))["codebook"][1] == -0.25


# --- quantization quality and exactness --------------------------------------------------------

@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_on_the_fly_matches_dequantized_model(base, ref_logits, k):
    model = load_kbit(base, bits=k)
    layers = kbit_layers(model)
    assert len(layers) == 2 * 7 and isinstance(model.lm_head, nn.Linear)
    assert isinstance(model.model.embed_tokens, nn.Embedding)
    ref = AutoModelForCausalLM.from_pretrained(base)
    werr = [rel(m.dequantize(torch.float32), ref.get_submodule(n).weight) for n, m in layers.items()]
    assert max(werr) < WEIGHT_BOUND[k], (k, max(werr))
    ids = tokens()
    q = logits(model, ids)
    assert rel(q, ref_logits) < LOGIT_BOUND[k]
    # the quantized forward is exactly the float forward on the dequantized weights
    torch.testing.assert_close(q, logits(dequantized_reference(base, model), ids), rtol=1e-5, atol=1e-5)


def test_error_decreases_with_bits(base, ref_logits):
    errs = [rel(logits(load_kbit(base, bits=k), tokens()), ref_logits) for k in (2, 3, 4, 5)]
    assert all(a > b for a, b in zip(errs[:-1], errs[1:], strict=True)), errs


def test_resident_layout_single_copy(base):
    model = load_kbit(base, bits=3)
    m = model.model.layers[0].mlp.down_proj  # 128 -> 64
    assert m.tiled and "weight" not in m._parameters and not hasattr(m, "weight")
    assert m.weight_packed.shape == (1, 128 // 32, 3, 128) and m.weight_packed.dtype == torch.int32
    assert m.weight_absmax.shape == (1, 128 // 32, 128) and m.weight_absmax.dtype == torch.uint8
    assert torch.equal(m.codebook.cpu(), normal_float_codebook(3))
    assert all(not p.requires_grad for p in m.parameters())
    assert model.is_quantized and model.quantization_method == "kbit"


def test_bf16_model(base, ref_logits):
    model = AutoModelForCausalLM.from_pretrained(base, quantization_config=KbitConfig(bits=4), dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert model.model.layers[0].self_attn.q_proj.codebook.dtype == torch.float32
    q = logits(model, tokens())
    assert torch.isfinite(q).all() and rel(q, ref_logits) < LOGIT_BOUND[4] + 0.05


# --- serialization ---------------------------------------------------------------------------

def test_save_reload_bit_identical(base, tmp_path):
    model = load_kbit(base, bits=3)
    ids = tokens()
    before = logits(model, ids)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    out = str(tmp_path / "kbit3")
    model.save_pretrained(out)

    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert qc == {"quant_method": "kbit", "bits": 3, "blocksize": 32, "modules_to_not_convert": ["lm_head"]}
    tensors = load_file(os.path.join(out, "model.safetensors"))
    p = "model.layers.0.mlp.up_proj."  # 64 -> 128
    assert tensors[p + "weight_packed"].dtype == torch.int32 and tensors[p + "weight_packed"].shape == (128, 2 * 3)
    assert tensors[p + "weight_absmax"].dtype == torch.uint8 and tensors[p + "weight_absmax"].shape == (128, 2)
    assert tensors[p + "codebook"].dtype == torch.float32 and tensors[p + "codebook"].shape == (8,)
    assert p + "weight" not in tensors and "lm_head.weight" in tensors

    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(reloaded.config.quantization_config, KbitConfig)
    assert all(m.tiled for m in kbit_layers(reloaded).values())
    sd2 = reloaded.state_dict()
    assert sd.keys() == sd2.keys()
    for k, v in sd.items():
        assert v.dtype == sd2[k].dtype and torch.equal(v, sd2[k]), k
    assert torch.equal(logits(reloaded, ids), before)


def test_custom_codebook_saved(base, tmp_path):
    cb = [-1.0, -0.2, 0.3, 1.0]
    model = load_kbit(base, bits=2, codebook=cb)
    assert torch.equal(model.model.layers[1].self_attn.o_proj.codebook.cpu(), torch.tensor(cb))
    out = str(tmp_path / "cb")
    model.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["quantization_config"]["codebook"] == cb
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(logits(reloaded, tokens()), logits(model, tokens()))


def test_missing_checkpoint_tensor_is_an_error(base, tmp_path):
    out = str(tmp_path / "broken")
    load_kbit(base, bits=4).save_pretrained(out)
    f = os.path.join(out, "model.safetensors")
    tensors = load_file(f)
    del tensors["model.layers.1.self_attn.k_proj.weight_absmax"]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj.*weight_absmax"):
        AutoModelForCausalLM.from_pretrained(out)


def test_load_state_dict_into_resident_model(base):
    a, b = load_kbit(base, bits=5), load_kbit(base, bits=5)
    with torch.no_grad():
        for m in kbit_layers(b).values():
            m.weight_packed.zero_()
    b.load_state_dict(a.state_dict())
    assert torch.equal(logits(a, tokens()), logits(b, tokens()))


# --- which layers are converted ----------------------------------------------------------------

def test_modules_to_not_convert(base, tmp_path):
    model = load_kbit(base, bits=4, modules_to_not_convert=["gate_proj", "model.layers.1.self_attn.q_proj"])
    assert isinstance(model.lm_head, nn.Linear)  # default skip kept
    for i in (0, 1):
        assert type(model.model.layers[i].mlp.gate_proj) is nn.Linear
        assert isinstance(model.model.layers[i].mlp.up_proj, KbitLinear)
    assert type(model.model.layers[1].self_attn.q_proj) is nn.Linear
    assert isinstance(model.model.layers[0].self_attn.q_proj, KbitLinear)
    out = str(tmp_path / "skip")
    model.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)["quantization_config"]["modules_to_not_convert"]
    assert saved == sorted(["gate_proj", "lm_head", "model.layers.1.self_attn.q_proj"])
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert type(reloaded.model.layers[1].self_attn.q_proj) is nn.Linear
    assert torch.equal(logits(reloaded, tokens()), logits(model, tokens()))


def test_lm_head_opt_in(base, ref_logits, tmp_path):
    """lm_head=True quantizes the (untied) output projection; it saves and reloads as kbit."""
    model = load_kbit(base, bits=4, lm_head=True)
    assert isinstance(model.lm_head, KbitLinear) and len(kbit_layers(model)) == 2 * 7 + 1
    ids = tokens()
    q = logits(model, ids)
    torch.testing.assert_close(q, logits(dequantized_reference(base, model), ids), rtol=1e-5, atol=1e-5)
    # the head's error is on top of the decoder's: the logits move away from the lm_head=False model
    plain = logits(load_kbit(base, bits=4), ids)
    assert rel(q, plain) > 0.02 and rel(q, ref_logits) < LOGIT_BOUND[4] + 0.1
    out = str(tmp_path / "head")
    model.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert qc["lm_head"] is True and "lm_head" not in qc["modules_to_not_convert"]
    tensors = load_file(os.path.join(out, "model.safetensors"))
    assert "lm_head.weight" not in tensors and tensors["lm_head.weight_packed"].shape == (128, 2 * 4)
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(reloaded.lm_head, KbitLinear)
    assert torch.equal(logits(reloaded, ids), q)


def test_lm_head_tied_stays_float(tmp_path, caplog):
    tied = save_tiny_llama(str(tmp_path / "tied"), tie_word_embeddings=True)
    with caplog.at_level("WARNING", logger="kbit_vllm"):
        model = load_kbit(tied, bits=4, lm_head=True)
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.model.embed_tokens.weight
    assert "tied to the input embeddings" in caplog.text


def test_lm_head_and_skip_list_disagree(base):
    with pytest.raises(ValueError, match=r"lm_head=True but modules_to_not_convert=\['lm_head'\]"):
        load_kbit(base, bits=4, lm_head=True, modules_to_not_convert=["lm_head"])


def test_in_features_not_multiple_of_32(tmp_path):
    base = save_tiny_llama(str(tmp_path / "h80"), hidden_size=80, num_attention_heads=4, num_key_value_heads=2)
    msg = r"'model\.layers\.0\.self_attn\.q_proj'.*in_features=80.*modules_to_not_convert"
    with pytest.raises(ValueError, match=msg):
        load_kbit(base, bits=4)
    skip = ["model.layers.*.self_attn", "gate_proj", "up_proj"]
    model = load_kbit(base, bits=4, modules_to_not_convert=skip)
    assert set(n.rsplit(".", 1)[-1] for n in kbit_layers(model)) == {"down_proj"}
    assert torch.isfinite(logits(model, tokens())).all()


# --- runtime ---------------------------------------------------------------------------------

def test_generate_matches_dequantized_model(base):
    model = load_kbit(base, bits=4)
    ref = dequantized_reference(base, model)
    ids = tokens(batch=1, seq=6)
    out = model.generate(ids.to(model.device), max_new_tokens=8, do_sample=False).cpu()
    assert out.shape == (1, 14)
    assert torch.equal(out, ref.generate(ids, max_new_tokens=8, do_sample=False))


def test_param_element_size_for_device_map(base):
    """device_map planning must see k/8 + 1/32 bytes per quantized weight, not the float size."""
    from transformers import AutoConfig

    from kbit_vllm.quant_config.hf_quantizers import KbitHfQuantizer

    q = KbitHfQuantizer(KbitConfig(bits=2), pre_quantized=False)
    q.update_dtype(torch.float32)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base))
    q._process_model_before_weight_loading(meta)
    name = "model.layers.0.mlp.up_proj.weight"
    assert q.param_element_size(meta, name, meta.get_parameter(name)) == pytest.approx(2 / 8 + 1 / 32)
    assert q.param_element_size(meta, "lm_head.weight", meta.lm_head.weight) == 4


def test_device_map_auto(base):
    pytest.importorskip("accelerate")
    model = AutoModelForCausalLM.from_pretrained(base, quantization_config=KbitConfig(bits=2), device_map="auto")
    assert isinstance(model.model.layers[0].mlp.up_proj, KbitLinear)
    assert torch.isfinite(logits(model, tokens())).all()


def test_torch_compile_forward(base):
    model = load_kbit(base, bits=3)
    ids = tokens()
    eager = logits(model, ids)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=False)
    with torch.no_grad():
        out = compiled(input_ids=ids.to(model.device)).logits.float().cpu()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
