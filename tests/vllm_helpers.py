"""Builders for the vLLM tests: tiny local Llama checkpoints (fp, dequantized, kbit, AWQ) and an
engine runner. Nothing comes from a hub; every folder is written here with safetensors.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
from pathlib import Path
from typing import Any, NamedTuple

import torch

# vLLM's CPU wheel loads its AVX2 kernel build where the CPU lacks AVX-512 (the test vLLM's own
# platforms/cpu.py makes). That build has no WNA16 GEMM, so vLLM's built-in "awq" cannot run, and
# two tiny random MoE comparisons (qwen3_moe k=2 against HF, Mixtral TP=2 against TP=1) leave the
# logprob tolerance there, at the commits before and after 2026-11-22's change alike (an AMD EPYC
# without AVX-512). The cause is not pinned down (a near-tied expert choice is the suspect; the
# token-level near-tie rule does not cover that); the AVX-512 machines run them.
VLLM_AVX2_ONLY = platform.machine() in ("x86_64", "AMD64") and not torch.cpu._is_avx512_supported()
AVX2_REASON = "vLLM's AVX2 CPU build (no AVX-512 here): see vllm_helpers.VLLM_AVX2_ONLY"

VOCAB = 128
PROMPTS = ["t1 t2 t3 t4", "t9 t8 t7", "t20 t21 t22 t23 t24 t25", "t5"]
MAX_TOKENS = 8
TOP_K = 5


class Gen(NamedTuple):
    """One greedy completion: token ids, the logprob of each chosen token, and the text."""

    ids: list[int]
    logprobs: list[float]
    text: str
    top: list[dict[int, float]]  # the TOP_K most likely tokens of each step


def set_cpu_env() -> None:
    """Engine settings for 2 shared CPU cores: spawned workers, a small KV cache."""
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # Engine core in this process: saves a ~10 s interpreter start per engine on 2 cores.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def write_tokenizer(path: Path) -> None:
    """A word-level tokenizer over 't0'..'t{VOCAB-4}' plus specials, saved as a fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"t{i}": i + 3 for i in range(VOCAB - 3)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(path))


def llama_state(hidden: int = 128, inter: int = 256, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> tuple[Any, dict[str, torch.Tensor]]:
    """(LlamaConfig, state dict) of a random tiny Llama with peaked logits (init std 0.1)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
                      initializer_range=0.1, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(dtype)
    cfg.torch_dtype = dtype
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    return cfg, state


def moe_state(kind: str = "mixtral", hidden: int = 128, inter: int = 128, layers: int = 2, experts: int = 4,
              top_k: int = 2, seed: int = 0,
              dtype: torch.dtype = torch.bfloat16) -> tuple[Any, dict[str, torch.Tensor]]:
    """(config, state dict) of a random tiny Mixtral or Qwen3-MoE, with per-expert tensor names as the
    original checkpoints store them (`experts.<e>.w1.weight` / `experts.<e>.gate_proj.weight`)."""
    import tempfile

    from safetensors.torch import load_file
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    if kind == "mixtral":
        cfg = MixtralConfig(intermediate_size=inter, num_local_experts=experts, num_experts_per_tok=top_k, **common)
        cls = MixtralForCausalLM
    elif kind == "qwen3_moe":
        cfg = Qwen3MoeConfig(intermediate_size=2 * inter, moe_intermediate_size=inter, num_experts=experts,
                             num_experts_per_tok=top_k, norm_topk_prob=True, head_dim=hidden // 4,
                             decoder_sparse_step=1, mlp_only_layers=[], **common)
        cls = Qwen3MoeForCausalLM
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    model = cls(cfg).to(dtype)
    with torch.no_grad():  # experts are 3-D parameters that _init_weights may leave at zero
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.1)
    cfg.torch_dtype = dtype
    with tempfile.TemporaryDirectory() as d:  # save_pretrained writes the original per-expert names
        model.save_pretrained(d)
        state = load_file(os.path.join(d, "model.safetensors"))
    return cfg, state


def is_quantizable(name: str, lm_head: bool = False) -> bool:
    """Decoder linear and expert weights (and lm_head if asked); embeddings, norms and routers stay unquantized."""
    if lm_head and name == "lm_head.weight":
        return True
    return ".layers." in name and (name.endswith("_proj.weight") or (".experts." in name and name.endswith(".weight")))


def save_folder(path: Path, cfg: Any, state: dict[str, torch.Tensor],
                quantization_config: dict[str, Any] | None = None) -> Path:
    """config.json (+quantization_config), tokenizer, and one model.safetensors."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(path))
    if quantization_config is not None:
        cfg_path = path / "config.json"
        d = json.loads(cfg_path.read_text())
        d["quantization_config"] = quantization_config
        cfg_path.write_text(json.dumps(d, indent=2))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    write_tokenizer(path)
    return path


def kbit_state(state: dict[str, torch.Tensor], bits: int, with_codebook: bool = True,
               lm_head: bool = False) -> dict[str, torch.Tensor]:
    """Pre-quantized kbit tensors: <layer>.weight_packed int32, <layer>.weight_absmax uint8, <layer>.codebook."""
    from kbit_vllm import normal_float_codebook, ops

    cb = normal_float_codebook(bits)
    out: dict[str, torch.Tensor] = {}
    for name, w in state.items():
        if is_quantizable(name, lm_head):
            layer = name[: -len(".weight")]
            packed, absmax = ops.kbit_quantize(w, cb, bits)
            out[f"{layer}.weight_packed"] = packed
            out[f"{layer}.weight_absmax"] = absmax
            if with_codebook:
                out[f"{layer}.codebook"] = cb.clone()
        else:
            out[name] = w
    return out


def kbit_dequantized_state(state: dict[str, torch.Tensor], bits: int, lm_head: bool = False) -> dict[str, torch.Tensor]:
    """The same weights after a kbit round trip, stored as plain tensors in the model dtype."""
    from kbit_vllm import normal_float_codebook, ops

    cb = normal_float_codebook(bits)
    out = dict(state)
    for name, w in state.items():
        if is_quantizable(name, lm_head):
            packed, absmax = ops.kbit_quantize(w, cb, bits)
            out[name] = ops.kbit_dequantize(packed, absmax, cb, bits, w.dtype)
    return out


def awq_state(state: dict[str, torch.Tensor], group_size: int) -> dict[str, torch.Tensor]:
    """AutoAWQ GEMM tensors (qweight, qzeros, scales fp16) for every decoder linear layer."""
    from kbit_vllm.formats import quantize_awq_rtn

    out: dict[str, torch.Tensor] = {}
    for name, w in state.items():
        if is_quantizable(name):
            layer = name[: -len(".weight")]
            qw, qz, sc = quantize_awq_rtn(w, group_size)
            out[f"{layer}.qweight"], out[f"{layer}.qzeros"], out[f"{layer}.scales"] = qw, qz, sc
        else:
            out[name] = w
    return out


def awq_dequantized_state(state: dict[str, torch.Tensor], group_size: int) -> dict[str, torch.Tensor]:
    from kbit_vllm import ops
    from kbit_vllm.formats import quantize_awq_rtn

    out = dict(state)
    for name, w in state.items():
        if is_quantizable(name):
            out[name] = ops.awq_dequantize(*quantize_awq_rtn(w, group_size), group_size).to(w.dtype)
    return out


def run_llm(model: str | Path, prompts: list[str] | None = None, max_tokens: int = MAX_TOKENS,
            **kwargs: Any) -> list[Gen]:
    """Start an engine, greedy-generate, shut it down. Returns one Gen per prompt."""
    set_cpu_env()
    from vllm import LLM, SamplingParams

    kwargs.setdefault("enforce_eager", True)
    kwargs.setdefault("max_model_len", 128)
    kwargs.setdefault("max_num_seqs", 8)
    kwargs.setdefault("max_num_batched_tokens", 128)
    llm = LLM(model=str(model), seed=0, **kwargs)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=TOP_K, ignore_eos=True)
        outs = llm.generate(prompts or PROMPTS, params, use_tqdm=False)
        result = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs, strict=True)]
            top = [{t: float(lp.logprob) for t, lp in step.items()} for step in c.logprobs]
            result.append(Gen(ids, lps, c.text, top))
        return result
    finally:
        shutdown(llm)


def run_llm_isolated(model: str | Path, timeout: float = 600, **kwargs: Any) -> list[Gen]:
    """run_llm in a fresh interpreter, for torch.compile engines.

    An in-process engine compiles with dynamo inside the pytest process, where state left by
    earlier engines and tests (dynamo caches, dispatch-mode thread state) made a compiled run
    fail once in CI ("you set no_dispatch() before calling into this function") though it passes
    alone; a fresh interpreter gives every compiled engine the same clean start.
    """
    import subprocess
    import sys

    set_cpu_env()
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import vllm_helpers as H; "
            "out = H.run_llm(sys.argv[2], **json.loads(sys.argv[3])); "
            "print('GENS ' + json.dumps([[g.ids, g.logprobs, g.text, "
            "[{str(t): lp for t, lp in d.items()} for d in g.top]] for g in out]))")
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(model), json.dumps(kwargs)],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GENS ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"isolated vLLM run of {model} failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-4000:]}")
    return [Gen(ids, lps, text, [{int(t): lp for t, lp in d.items()} for d in top])
            for ids, lps, text, top in json.loads(lines[-1][5:])]


def cached_runner(runs: dict[str, tuple[str, dict[str, Any]]], folders: dict[str, Path],
                  cache: dict[str, list[Gen]]):
    """name -> generations of runs[name] = (folder key, LLM kwargs), each engine started once.

    TP runs pin one core per rank (single-NUMA CPU hosts); compiled runs get a fresh interpreter.
    """

    def get(name: str) -> list[Gen]:
        if name not in cache:
            folder, kwargs = runs[name]
            runner = run_llm if kwargs.get("enforce_eager", True) else run_llm_isolated
            with tp_cores(kwargs.get("tensor_parallel_size", 1)):
                cache[name] = runner(folders[folder], **kwargs)
        return cache[name]

    return get


@contextlib.contextmanager
def tp_cores(tp: int):
    """For TP > 1 on a single-NUMA CPU host, pin one core per rank while the engine runs."""
    if tp <= 1:
        yield
        return
    old = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = old


def shutdown(llm: Any) -> None:
    """Stop the engine core and workers now so the next engine gets the cores and memory."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # best effort, the object is dropped anyway
        pass
    del llm
    gc.collect()


def run_llm_subprocess(model: str | Path, timeout: float = 240, **kwargs: Any) -> tuple[int, str]:
    """run_llm in a fresh interpreter; (exit code, stdout+stderr).

    Errors raised in the engine core / worker reach the frontend only as "Engine core
    initialization failed"; the real message is in the process output, which this returns.
    """
    import subprocess
    import sys

    set_cpu_env()
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import vllm_helpers as H; "
            "H.run_llm(sys.argv[2], max_tokens=2, **json.loads(sys.argv[3]))")
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(model), json.dumps(kwargs)],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    return proc.returncode, proc.stdout + proc.stderr


def assert_logprobs_close(a: list[Gen], b: list[Gen], tol: float) -> None:
    """Greedy runs agree: same tokens with logprobs within tol, up to a near-tie.

    Two runs whose logits differ by rounding alone may pick different tokens where the top two
    are nearly tied; past that point they see different inputs. So at the first divergence
    each run's token must be among the other's TOP_K with a logprob within tol of it, and the
    comparison of that sequence stops there (the rule vLLM's own check_logprobs_close uses).
    """
    for n, (ga, gb) in enumerate(zip(a, b, strict=True)):
        for i, (ta, tb) in enumerate(zip(ga.ids, gb.ids, strict=True)):
            if ta != tb:
                assert ta in gb.top[i] and tb in ga.top[i], f"prompt {n} step {i}: {ta} vs {tb} not a near-tie"
                assert abs(ga.top[i][ta] - gb.top[i][ta]) <= tol and abs(ga.top[i][tb] - gb.top[i][tb]) <= tol
                break
            d = abs(ga.logprobs[i] - gb.logprobs[i])
            assert d <= tol, f"prompt {n} step {i} token {ta}: logprob diff {d:.4f} > {tol}"


def assert_matches_hf(folder: str | Path, gens: list[Gen], tol: float, model: Any = None) -> None:
    """vLLM's greedy tokens and logprobs agree with a transformers forward (fp32) over the same ids.

    An independent reference: the HF model runs the folder's weights with its own kernels. At a
    step where HF prefers another token, the two must be within tol (a near-tie) and the
    comparison of that prompt stops there.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model is None:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(folder))
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        full = torch.cat([ids, torch.tensor([gen.ids])], dim=1)
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=full).logits.float(), dim=-1)[0]
        for i, t in enumerate(gen.ids):
            step = logp[ids.shape[1] - 1 + i]
            assert abs(float(step[t]) - gen.logprobs[i]) <= tol, \
                f"{prompt!r} step {i}: HF {float(step[t]):.4f} vs vLLM {gen.logprobs[i]:.4f}"
            hf_best = int(step.argmax())
            if hf_best != t:
                assert float(step[hf_best] - step[t]) <= tol, f"{prompt!r} step {i}: {hf_best} vs {t}"
                break
