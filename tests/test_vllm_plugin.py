"""End-to-end vLLM tests of the kbit and awq_orin plugin on real CPU engines.

Every engine start costs ~20 s on 2 cores, so each configuration runs once (cached per module)
and several tests read the same run.

Tolerance: a kbit engine and a plain engine loaded with the *same weights dequantized* run the
same math; only the GEMM differs (kbit_linear dequantizes to the activation dtype and calls
F.linear, the plain path uses vLLM's CPU GEMM). Their logits differ by accumulation order
only: ~1e-3 relative in bf16/fp16. LOGPROB_TOL = 0.05 is well above that yet far below what a
wrong bit, codebook entry or shard costs (k=2 vs k=4 of one source moves these logprobs by
>0.1, checked in test_bits_change_the_model). Greedy tokens must match except at a near-tie
(see vllm_helpers.assert_logprobs_close); compiled vs eager differ that way through inductor's
fused norms and activations, not through kbit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

import vllm_helpers as H  # noqa: E402

LOGPROB_TOL = 0.05
GROUP = 64


def kbit_overrides(bits: int, **extra: object) -> dict:
    return {"quantization_config": {"quant_method": "kbit", "bits": bits, **extra}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """bf16 and fp16 source models plus their dequantized / pre-quantized / AWQ variants."""
    import torch

    root = tmp_path_factory.mktemp("vllm_models")
    cfg, bf = H.llama_state(dtype=torch.bfloat16, seed=0)
    cfg16, f16 = H.llama_state(dtype=torch.float16, seed=1)
    out = {
        "bf16": H.save_folder(root / "bf16", cfg, bf),
        "fp16": H.save_folder(root / "fp16", cfg16, f16),
        "kbit3": H.save_folder(root / "kbit3", cfg16, H.kbit_state(f16, 3), {"quant_method": "kbit", "bits": 3}),
        "awq": H.save_folder(root / "awq", cfg16, H.awq_state(f16, GROUP),
                             {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                              "version": "gemm"}),
        "awq_deq": H.save_folder(root / "awq_deq", cfg16, H.awq_dequantized_state(f16, GROUP)),
    }
    for k in (2, 4, 5):
        out[f"deq{k}"] = H.save_folder(root / f"deq{k}", cfg, H.kbit_dequantized_state(bf, k))
    out["deq3"] = H.save_folder(root / "deq3", cfg16, H.kbit_dequantized_state(f16, 3))
    out["deq4_head"] = H.save_folder(root / "deq4_head", cfg, H.kbit_dequantized_state(bf, 4, lm_head=True))
    out["kbit4_head"] = H.save_folder(root / "kbit4_head", cfg, H.kbit_state(bf, 4, lm_head=True),
                                      {"quant_method": "kbit", "bits": 4})
    return out


# name -> (folder, run_llm kwargs); results are computed on first use and shared.
RUNS: dict[str, tuple[str, dict]] = {
    "kbit4": ("bf16", {"quantization": "kbit", "dtype": "bfloat16"}),  # defaults: bits=4
    "deq4": ("deq4", {"dtype": "bfloat16"}),
    "kbit2": ("bf16", {"hf_overrides": kbit_overrides(2), "dtype": "bfloat16"}),  # method inferred
    "deq2": ("deq2", {"dtype": "bfloat16"}),
    "kbit3": ("fp16", {"quantization": "kbit", "hf_overrides": kbit_overrides(3), "dtype": "float16"}),
    "deq3": ("deq3", {"dtype": "float16"}),
    "kbit5_compiled": ("bf16", {"quantization": "kbit", "hf_overrides": kbit_overrides(5), "dtype": "bfloat16",
                                "enforce_eager": False}),
    "deq5": ("deq5", {"dtype": "bfloat16"}),
    "prequant3": ("kbit3", {"quantization": "kbit", "dtype": "float16"}),
    "kbit4_head": ("bf16", {"quantization": "kbit", "hf_overrides": kbit_overrides(4, lm_head=True),
                            "dtype": "bfloat16"}),
    "deq4_head": ("deq4_head", {"dtype": "bfloat16"}),
    "prequant4_head": ("kbit4_head", {"quantization": "kbit", "dtype": "bfloat16"}),
    "kbit4_tp2": ("bf16", {"quantization": "kbit", "dtype": "bfloat16", "tensor_parallel_size": 2}),
    "awq_orin": ("awq", {"quantization": "awq_orin", "dtype": "float16"}),
    "awq_builtin": ("awq", {"quantization": "awq", "dtype": "float16"}),
}

_CACHE: dict[str, list[H.Gen]] = {}


@pytest.fixture(scope="module")
def run(folders: dict[str, Path]):
    return H.cached_runner(RUNS, folders, _CACHE)


def assert_close(a: list[H.Gen], b: list[H.Gen], tol: float = LOGPROB_TOL) -> None:
    H.assert_logprobs_close(a, b, tol)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_kbit_matches_dequantized_eager(run, k: int) -> None:
    got = run(f"kbit{k}")
    assert all(len(g.ids) == H.MAX_TOKENS for g in got)
    assert_close(got, run(f"deq{k}"))


def test_kbit5_compiled_matches_dequantized(run) -> None:
    """enforce_eager=False: the kbit_linear op is traced by torch.compile (inductor on CPU)."""
    assert_close(run("kbit5_compiled"), run("deq5"))


def test_bits_change_the_model(run) -> None:
    """The comparisons above can fail: bits 2 and 4 of one source give different logprobs."""
    a, b = run("kbit2"), run("kbit4")
    diff = max(abs(x - y) for ga, gb in zip(a, b, strict=True)
               for x, y in zip(ga.logprobs, gb.logprobs, strict=True))
    assert diff > 0.1


def test_prequantized_equals_online(run) -> None:
    """weight_packed/weight_absmax/codebook written by kbit_quantize load to the same model."""
    for a, b in zip(run("prequant3"), run("kbit3"), strict=True):
        assert a.ids == b.ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)


def test_lm_head_opt_in_matches_dequantized(run) -> None:
    """lm_head=true quantizes vLLM's ParallelLMHead, and it is what moves the logprobs away from
    the same model with a bf16 head (kbit4: identical decoder layers)."""
    assert_close(run("kbit4_head"), run("deq4_head"))
    moved = max(abs(x - y) for ga, gb in zip(run("kbit4_head"), run("kbit4"), strict=True)
                for x, y in zip(ga.logprobs, gb.logprobs, strict=True))
    assert moved > LOGPROB_TOL


def test_prequantized_lm_head_equals_online(run) -> None:
    """A folder holding lm_head.weight_packed loads its head quantized without any config flag."""
    for a, b in zip(run("prequant4_head"), run("kbit4_head"), strict=True):
        assert a.ids == b.ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)


def test_tp2_matches_tp1(run) -> None:
    """Merged QKV / gate_up column shards and row shards split on 32-channel blocks."""
    assert_close(run("kbit4_tp2"), run("kbit4"))


@pytest.mark.skipif(H.VLLM_AVX2_ONLY, reason=f"{H.AVX2_REASON}: no cpu_gemm_wna16 for built-in awq")
def test_awq_orin_matches_builtin_awq(run) -> None:
    """vLLM 0.28 CPU runs built-in "awq" (CPU WNA16 kernel), so compare against it directly."""
    assert_close(run("awq_orin"), run("awq_builtin"))
