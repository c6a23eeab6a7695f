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


@pytest.mark.parametrize("bits", [3])
def test_hf_saved_folder_served_by_vllm(tmp_path: Path, bits: int) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kbit_vllm import KbitConfig

    cfg, state = H.llama_state(dtype=torch.bfloat16, seed=3)
    src = H.save_folder(tmp_path / "src", cfg, state)
    model = AutoModelForCausalLM.from_pretrained(str(src), quantization_config=KbitConfig(bits=bits),
                                                 dtype=torch.bfloat16)
    saved = tmp_path / "kbit_hf"
    model.save_pretrained(str(saved))
    H.write_tokenizer(saved)

    got = H.run_llm(saved, quantization="kbit", dtype="bfloat16")
    tok = AutoTokenizer.from_pretrained(str(saved))
    for prompt, gen in zip(H.PROMPTS, got, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        full = torch.cat([ids, torch.tensor([gen.ids])], dim=1)
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=full).logits.float(), dim=-1)[0]
        for i, t in enumerate(gen.ids):
            step = logp[ids.shape[1] - 1 + i]
            assert abs(float(step[t]) - gen.logprobs[i]) <= LOGPROB_TOL, f"{prompt!r} step {i}"
            hf_best = int(step.argmax())
            if hf_best != t:  # a near-tie only: the two candidates within tolerance of each other
                assert float(step[hf_best] - step[t]) <= LOGPROB_TOL, f"{prompt!r} step {i}: {hf_best} vs {t}"
                break
