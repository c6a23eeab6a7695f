"""One kbit folder saved by the Hugging Face path is served by vLLM with the same outputs.

HF quantizes a tiny bf16 Llama on the fly and save_pretrained()s it; a vLLM engine loads that
folder as a pre-quantized kbit checkpoint. vLLM's greedy tokens and their logprobs must match
a forward pass of the HF model over the same ids. Tolerance as in test_vllm_plugin.py: both run
identical weights, only the GEMM/attention kernels (summation order, bf16 rounding) differ.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("transformers")

import vllm_helpers as H  # noqa: E402

LOGPROB_TOL = 0.05


@pytest.mark.parametrize(("bits", "lm_head"), [(3, False), (4, True)])
def test_hf_saved_folder_served_by_vllm(tmp_path: Path, bits: int, lm_head: bool) -> None:
    """lm_head=True: the saved lm_head.weight_packed makes vLLM quantize its ParallelLMHead too
    (an unquantized head would have no parameter to load it into)."""
    from transformers import AutoModelForCausalLM

    from kbit_vllm import KbitConfig

    cfg, state = H.llama_state(dtype=torch.bfloat16, seed=3)
    src = H.save_folder(tmp_path / "src", cfg, state)
    model = AutoModelForCausalLM.from_pretrained(str(src), quantization_config=KbitConfig(bits=bits, lm_head=lm_head),
                                                 dtype=torch.bfloat16)
    saved = tmp_path / "kbit_hf"
    model.save_pretrained(str(saved))
    H.write_tokenizer(saved)

    got = H.run_llm(saved, quantization="kbit", dtype="bfloat16")
    H.assert_matches_hf(saved, got, LOGPROB_TOL, model=model)


@pytest.mark.parametrize(("kind", "bits"), [
    ("mixtral", 4),
    pytest.param("qwen3_moe", 2,
                 marks=pytest.mark.skipif(H.VLLM_AVX2_ONLY, reason=f"{H.AVX2_REASON}: out of tolerance")),
])
def test_hf_saved_moe_folder_served_by_vllm(tmp_path: Path, kind: str, bits: int) -> None:
    """Fused experts quantized by HF are saved per expert (`experts.<e>.<proj>.weight_packed`), and vLLM's
    expert loader maps them onto KbitMoEMethod's stacked w13 / w2 parameters.

    Compared in float32 (the folder reloaded by HF, served by vLLM): in bf16 this tiny random MoE's top-2
    routing sits near ties, and vLLM's bf16 CPU kernels round differently per host (on an AMX / AVX512-BF16
    Xeon, Mixtral moved by 0.14 in logprob against the bf16 HF model, 2026-11-27), which says nothing about
    the expert mapping; a wrong expert or projection moves far more."""
    from transformers import AutoModelForCausalLM

    from kbit_vllm import KbitConfig
    from kbit_vllm.layers.hf_moe import KbitExperts

    cfg, state = H.moe_state(kind, dtype=torch.bfloat16, seed=4)
    src = H.save_folder(tmp_path / "src", cfg, state)
    model = AutoModelForCausalLM.from_pretrained(str(src), quantization_config=KbitConfig(bits=bits),
                                                 dtype=torch.bfloat16)
    assert sum(isinstance(m, KbitExperts) for m in model.modules()) == 2
    saved = tmp_path / "kbit_hf"
    model.save_pretrained(str(saved))
    H.write_tokenizer(saved)

    got = H.run_llm(saved, quantization="kbit", dtype="float32")
    H.assert_matches_hf(saved, got, LOGPROB_TOL)  # the folder reloaded in float32


def test_hf_resaved_awq_moe_folder_served_by_vllm(tmp_path: Path) -> None:
    """An AutoAWQ Mixtral checkpoint loaded by HF with AwqOrinConfig (AwqOrinExperts) and saved again is
    served by vLLM with quantization="awq_orin" (AwqOrinMoEMethod) with the HF model's outputs."""
    from hf_helpers import save_tiny_mixtral, write_awq_checkpoint
    from transformers import AutoModelForCausalLM

    from kbit_vllm import AwqOrinConfig
    from kbit_vllm.layers.hf_awq_moe import AwqOrinExperts

    awq = tmp_path / "awq"
    write_awq_checkpoint(save_tiny_mixtral(str(tmp_path / "base"), hidden=128), str(awq), 64)
    model = AutoModelForCausalLM.from_pretrained(str(awq), quantization_config=AwqOrinConfig(), dtype=torch.float16)
    assert sum(isinstance(m, AwqOrinExperts) for m in model.modules()) == 2
    saved = tmp_path / "awq_hf"
    model.save_pretrained(str(saved))
    H.write_tokenizer(saved)

    got = H.run_llm(saved, quantization="awq_orin", dtype="float16", max_model_len=64)  # the tiny model's positions
    H.assert_matches_hf(saved, got, LOGPROB_TOL, model=model)
