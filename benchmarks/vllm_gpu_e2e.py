"""kbit / awq_orin inside a real vLLM engine on the GPU, default mode (torch.compile + CUDA graphs).

Run on the GPU machine from the repo root, with vLLM importable (benchmarks/vllm_gpu_run.sh
unpacks the carried bundle and makes the vllm.general_plugins entry point visible):
    python3 benchmarks/vllm_gpu_e2e.py tiny_kbit4 tiny_deq4 bench_bf16 bench_kbit4 ...
Each name is "<model>_<config>": model tiny (2 layers, hidden 256), tinymoe (the same as a
Mixtral with 8 experts, top-2, written in the hub's per-expert layout), bench (Llama-3.2-1B
shapes, random bf16), l3 (Llama-3-8B shapes, random bf16, ~16 GB), q3moe (Qwen3-30B-A3B shapes:
hidden 2048, 128 experts of 768, top-8, vocab 151936, but KBIT_E2E_Q3MOE_LAYERS layers, default 12
of 48: ~8.1 B parameters, 16 GB bf16 / 5 GB awq, one safetensors shard per layer) or q3moetiny (its
code path at 2 layers, hidden 256, 8 experts, for a CPU check); config bf16, deq<k> (kbit round trip
stored as bf16), kbit<k> (online; kbit<k>h also quantizes lm_head), pre<k> (a kbit folder saved by
the HF path; not q3moe*), awq (vLLM's own AWQ; MoE experts on its Marlin MoE kernel on the GPU)
or awq_orin (both read one RTN int4 g128 AutoAWQ folder of the same random weights). Each engine
runs in its own subprocess (engine core in-process, so the weight-loading peak can be read) and
prints one RESULT JSON line:
layers, folder build and engine init seconds, compile and cudagraph modes, weight memory and the
peak while loading, then greedy outputs with logprobs (tiny*), decode tokens/s at batch 1 and 16
(bench), or decode tokens/s at batch 1, 16, 64 and prefill tokens/s on 2048-token prompts (l3,
q3moe*; KBIT_E2E_BATCHES="1,64,256" picks other decode batches). KBIT_E2E_CLEAN=1 deletes each
folder after the last name that reads it. KBIT_E2E_PROFILE=1
adds PROFILE lines (l3, q3moe*, bench): the GPU kernels of one decode step (batch
KBIT_E2E_PROFILE_BATCH, default 1), CUDA graph replays included, by time per step.
KBIT_E2E_TP=2 serves every engine with tensor_parallel_size=2 (the nvidia-h200-x2 machine; the load
peak, read in this process, is then not reported). After the last name, an AGREE line for each tiny*
pair run together: <model>_kbit<k> and <model>_pre<k> against <model>_deq<k> (the same weights
dequantized to bf16), <model>_awq_orin against <model>_awq (vLLM's own AWQ): how many prompts give
the same greedy tokens, and the largest logprob difference over the tokens both chose alike.
Without a GPU the engines run eager on vLLM's CPU backend (a check of the code path, not timings).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: peak memory
ROOT = "/tmp/kbit_e2e_models"
SHAPES = {
    "tiny": dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "tinymoe": dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
                    tie_word_embeddings=False),
    "bench": dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "l3": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False, rope_theta=500000.0),
    # Qwen3-30B-A3B (its config.json) with fewer layers: the GPU machine has 64 GB of disk and 10-minute calls
    "q3moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                  num_hidden_layers=int(os.environ.get("KBIT_E2E_Q3MOE_LAYERS", "12")), num_attention_heads=32,
                  num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                  decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=1000000.0,
                  max_position_embeddings=40960, attention_bias=False, tie_word_embeddings=False),
    "q3moetiny": dict(vocab_size=1024, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                      tie_word_embeddings=False),
}
MOE = ("tinymoe", "q3moe", "q3moetiny")
TIMED = ("l3", "q3moe", "q3moetiny")  # decode at batch 1/16/64 + prefill; bench: decode at 1/16 only
# KBIT_E2E_BATCHES="1,64,256,384" replaces those decode batches (captured, and max_num_seqs raised to
# the largest): past 128 tokens a step runs the wgmma kernels' tall tiles.
BATCHES = tuple(int(b) for b in os.environ.get("KBIT_E2E_BATCHES", "").split(",") if b.strip())
TP = int(os.environ.get("KBIT_E2E_TP", "1"))
GIB = 1 << 30


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def folder(model: str, variant: str) -> str:
    """q3moe folders carry the layer count, so another KBIT_E2E_Q3MOE_LAYERS never reuses a stale one."""
    tag = f"{model}{SHAPES[model]['num_hidden_layers']}L" if model == "q3moe" else model
    return f"{ROOT}/{tag}_{variant}"


def save_tokenizer(path: str, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    words = {w: i for i, w in enumerate(specials + [f"w{i}" for i in range(vocab - len(specials))])}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>").save_pretrained(path)


def make_folder(model: str, variant: str) -> str:
    """bf16 source, or its dequantized-kbit / AWQ-RTN variant, written once under ROOT.

    Llama shapes are drawn whole by transformers (one model.safetensors); MoE models are drawn
    by moe_layers, and q3moe* written one shard per decoder layer, so a 15 GB model never sits
    in memory whole. Random weights are drawn on the GPU when there is one.
    """
    import torch
    from safetensors.torch import save_file

    path = folder(model, variant)
    if os.path.exists(f"{path}/config.json"):
        return path
    dev = device()
    common = dict(bos_token_id=1, eos_token_id=2, pad_token_id=3, max_position_embeddings=4096,
                  torch_dtype="bfloat16")
    torch.manual_seed(0)
    if model in MOE:
        cfg = moe_config(model, common)
        chunks, n = moe_layers(cfg, dev), cfg.num_hidden_layers + 1
        if model == "tinymoe":  # one file, as before the sharded writer
            chunks, n = [{k: v for part in chunks for k, v in part.items()}], 1
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(**common, **SHAPES[model])
        with torch.device(dev):
            net = LlamaForCausalLM(cfg).to(torch.bfloat16)
        chunks, n = [{k: v.detach().contiguous() for k, v in net.state_dict().items()}], 1
        del net
    if variant == "awq":
        cfg.torch_dtype = "float16"
    tmp = f"{path}.part"  # renamed when complete: an interrupted build is never taken for a folder
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    cfg.save_pretrained(tmp)
    if variant == "awq":
        c = json.load(open(f"{tmp}/config.json"))
        c["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                                    "version": "gemm"}
        json.dump(c, open(f"{tmp}/config.json", "w"), indent=1)
    weight_map: dict[str, str] = {}
    total = 0
    for i, state in enumerate(chunks, 1):
        if cfg.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        state = convert(state, variant, dev)
        name = "model.safetensors" if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file({k: v.cpu() for k, v in state.items()}, f"{tmp}/{name}", metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(state, name))
        total += sum(v.numel() * v.element_size() for v in state.values())
        del state
    if n > 1:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
                  open(f"{tmp}/model.safetensors.index.json", "w"), indent=1)
    save_tokenizer(tmp, cfg.vocab_size)
    os.rename(tmp, path)
    if dev == "cuda":
        torch.cuda.empty_cache()
    return path


def convert(state: dict, variant: str, dev: str) -> dict:
    """One chunk of a bf16 state dict as the variant stores it: bf16, deq<k> or awq (RTN int4 g128, fp16)."""
    import torch

    lin = [k for k in state if ".layers." in k and (k.endswith("_proj.weight") or ".experts." in k)]
    if variant.startswith("deq"):
        from kbit_vllm import normal_float_codebook, ops

        k = int(variant[3:])
        cb = normal_float_codebook(k, dev)
        for n in lin:
            p, a = ops.kbit_quantize(state[n], cb, k)
            state[n] = ops.kbit_dequantize(p, a, cb, k, torch.bfloat16)
    elif variant == "awq":
        from kbit_vllm.formats import quantize_awq_rtn

        for n in lin:
            qw, qz, s = quantize_awq_rtn(state.pop(n), 128)
            base = n[: -len(".weight")]
            state[base + ".qweight"], state[base + ".qzeros"], state[base + ".scales"] = qw, qz, s
        state = {k: (v.half() if v.dtype == torch.bfloat16 else v) for k, v in state.items()}
    return state


def moe_config(model: str, common: dict):
    """Mixtral (tinymoe) or Qwen3-MoE (q3moe, q3moetiny) config of SHAPES[model]."""
    from transformers import MixtralConfig, Qwen3MoeConfig

    if model == "tinymoe":
        cfg = MixtralConfig(**common, **SHAPES[model])
        cfg.architectures = ["MixtralForCausalLM"]
    else:
        cfg = Qwen3MoeConfig(**{**common, **SHAPES[model]})  # q3moe sets its own max_position_embeddings
        cfg.architectures = ["Qwen3MoeForCausalLM"]
    return cfg


def moe_layers(cfg, dev: str, std: float = 0.05):
    """Random MoE weights as the hub stores them, one dict per yield: embeddings / final norm / lm_head
    first, then each decoder layer (attention, router, per-expert projections)."""
    import torch

    qwen = cfg.model_type == "qwen3_moe"
    h, v = cfg.hidden_size, cfg.vocab_size
    i = cfg.moe_intermediate_size if qwen else cfg.intermediate_size
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    qd, kvd = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    n_exp = cfg.num_experts if qwen else cfg.num_local_experts
    moe, (w1, w2, w3) = (("mlp", ("gate_proj", "down_proj", "up_proj")) if qwen
                         else ("block_sparse_moe", ("w1", "w2", "w3")))

    def rnd(*shape):
        return (torch.randn(*shape, device=dev) * std).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16, device=dev)

    yield {"model.embed_tokens.weight": rnd(v, h), "model.norm.weight": ones(h), "lm_head.weight": rnd(v, h)}
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        st = {p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h)}
        for n, shape in (("q", (qd, h)), ("k", (kvd, h)), ("v", (kvd, h)), ("o", (h, qd))):
            st[p + f"self_attn.{n}_proj.weight"] = rnd(*shape)
        if qwen:
            st[p + "self_attn.q_norm.weight"], st[p + "self_attn.k_norm.weight"] = ones(hd), ones(hd)
        st[p + f"{moe}.gate.weight"] = rnd(n_exp, h)
        for e in range(n_exp):
            q = p + f"{moe}.experts.{e}."
            st[q + f"{w1}.weight"], st[q + f"{w2}.weight"], st[q + f"{w3}.weight"] = rnd(i, h), rnd(h, i), rnd(i, h)
        yield st


def make_prequantized(model: str, k: int) -> str:
    """The bf16 folder quantized to kbit k by transformers + KbitConfig and saved (the HF path)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kbit_vllm import KbitConfig

    path = f"{ROOT}/{model}_pre{k}"
    if not os.path.exists(f"{path}/config.json"):
        src = make_folder(model, "bf16")
        net = AutoModelForCausalLM.from_pretrained(src, quantization_config=KbitConfig(bits=k),
                                                   dtype=torch.bfloat16, device_map="cuda")
        net.save_pretrained(path)
        AutoTokenizer.from_pretrained(src).save_pretrained(path)
        del net
        torch.cuda.empty_cache()
    return path


def watch_load_peak() -> dict:
    """Record the CUDA memory peak of the model load itself (before KV cache and warmup)."""
    import importlib

    import torch

    seen: dict = {}

    def wrap(orig):
        def load_model(self, *a, **kw):
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = orig(self, *a, **kw)
            torch.cuda.synchronize()
            seen["weights_gib"] = round((torch.cuda.memory_allocated() - base) / GIB, 2)
            seen["load_peak_gib"] = round((torch.cuda.max_memory_allocated() - base) / GIB, 2)
            return out
        return load_model

    # 0.25.1 runs the model runner in vllm/v1/worker/gpu/; later versions in gpu_model_runner.py
    for mod in ("vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu_model_runner"):
        try:
            cls = importlib.import_module(mod).GPUModelRunner
        except (ImportError, AttributeError):
            continue
        cls.load_model = wrap(cls.load_model)
    return seen


def folders_of(name: str) -> list[str]:
    """The folders a run reads (make_prequantized also reads the bf16 one)."""
    model, config = name.split("_", 1)
    if config.startswith("pre"):
        return [f"{ROOT}/{model}_{config}", folder(model, "bf16")]
    if config.startswith("kbit"):
        return [folder(model, "bf16")]
    return [folder(model, "awq" if config in ("awq", "awq_orin") else config)]


def decode_tok_s(llm, sp_cls, batch: int, n: int, vocab: int, reps: int = 2) -> float:
    """Decode-only tokens/s: (n-token run - 1-token run) over n-1 steps, best of reps; 32-token prompts."""
    span = min(30000, vocab - 10)
    prompts = [{"prompt_token_ids": [10 + (7 * i + j) % span for j in range(32)]} for i in range(batch)]

    def gen(tokens: int) -> float:
        t = time.perf_counter()
        llm.generate(prompts, sp_cls(max_tokens=tokens, temperature=0.0, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t

    gen(n // 2)  # warm-up
    t_n = min(gen(n) for _ in range(reps))
    t_1 = min(gen(1) for _ in range(reps))
    return round(batch * (n - 1) / (t_n - t_1), 1)


def prefill_tok_s(llm, sp_cls, vocab: int, reps: int) -> float:
    """8 prompts of 2048 tokens, one output token each (no prefix caching: computed every time)."""
    span = min(120000, vocab - 10)
    prompts = [{"prompt_token_ids": [10 + (13 * i + 7 * j) % span for j in range(2048)]} for i in range(8)]
    one = sp_cls(max_tokens=1, temperature=0.0)
    llm.generate(prompts, one, use_tqdm=False)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        llm.generate(prompts, one, use_tqdm=False)
        ts.append(time.perf_counter() - t)
    return round(8 * 2048 / min(ts), 0)


def child(name: str) -> None:
    import torch

    gpu = torch.cuda.is_available()
    if not gpu:  # CPU check of the code path (tests/vllm_helpers.set_cpu_env): small KV cache
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from vllm import LLM, SamplingParams

    model, config = name.split("_", 1)
    kw: dict = {}
    t0 = time.perf_counter()
    if config.startswith("pre"):  # a kbit folder written by the HF path, served as a checkpoint
        kw = dict(quantization="kbit")
        path = make_prequantized(model, int(config[3:]))
    elif config.startswith("kbit"):
        qc: dict = {"quant_method": "kbit", "bits": int(config[4:].removesuffix("h"))}
        if config.endswith("h"):
            qc["lm_head"] = True
        kw = dict(quantization="kbit", hf_overrides={"quantization_config": qc})
        path = make_folder(model, "bf16")
    elif config in ("awq", "awq_orin"):
        kw = dict(quantization=config, dtype="float16")
        path = make_folder(model, "awq")
    else:
        path = make_folder(model, config)
    folder_s = round(time.perf_counter() - t0, 1)
    kw.setdefault("dtype", "bfloat16")
    if TP > 1:  # workers in their own processes; spawned, as a fork after CUDA is up cannot use it
        kw["tensor_parallel_size"] = TP
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    peak = watch_load_peak() if gpu and TP == 1 else {}
    t0 = time.perf_counter()
    timed = model in TIMED
    batches = BATCHES or ((1, 16, 64) if timed else (1, 16))
    if timed:  # capture the decode sizes measured here only (prefill chunks run compiled, uncaptured);
        # no prefix caching, so repeated prefill prompts are computed every time
        kw["compilation_config"] = {"cudagraph_capture_sizes": sorted({1, 2, 4, 8, 16, 32, 64, *batches})}
        kw["enable_prefix_caching"] = False
    if max(batches) > 256:  # vLLM's default max_num_seqs
        kw["max_num_seqs"] = max(batches)
    if gpu:
        kw["gpu_memory_utilization"] = 0.5 if timed else 0.45
    else:  # no torch.compile on a 2-core CPU: eager, as the CPU tests run
        kw["enforce_eager"] = True
        kw.pop("compilation_config", None)
    llm = LLM(model=path, max_model_len=4096 if timed else 1024, seed=0, **kw)
    vcfg = llm.llm_engine.vllm_config
    cc = vcfg.compilation_config
    hf = vcfg.model_config.hf_config
    res: dict = {"name": name, "tp": TP, "layers": hf.num_hidden_layers, "folder_s": folder_s,
                 "init_s": round(time.perf_counter() - t0, 1), "compile_mode": str(cc.mode),
                 "cudagraph_mode": str(cc.cudagraph_mode), "quantization": vcfg.model_config.quantization, **peak}
    t0 = time.perf_counter()
    if model in ("tiny", "tinymoe"):
        sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
        outs = llm.generate(["w1 w2 w3 w4", "w10 w20 w30", "w5"], sp, use_tqdm=False)
        res["outputs"] = []
        for o in outs:
            c = o.outputs[0]
            lps = [round(float(s[t].logprob), 4) for t, s in zip(c.token_ids, c.logprobs, strict=True)]
            res["outputs"].append([list(c.token_ids), lps])
    else:
        # 128-token windows, decode best of 5: a batch-1 window is ~0.3 s (l3) or ~0.2 s (q3moe),
        # and best of 2 moved by up to 8% (l3, H200 session 23) and 30% (q3moe 64-token windows:
        # 420-756 tok/s for one library, sessions 25-26) between runs. Prefill best of 3 (l3) or 2
        # (q3moe*, so that four engines fit one 10-minute device call; startup dominates anyway).
        n, decode_reps, prefill_reps = 128, 5, (3 if model in ("bench", "l3") else 2)
        for b in batches:
            res[f"bs{b}_decode_tok_s"] = decode_tok_s(llm, SamplingParams, b, n, hf.vocab_size, decode_reps)
        if timed:
            res["prefill2048_tok_s"] = prefill_tok_s(llm, SamplingParams, hf.vocab_size, prefill_reps)
    res["measure_s"] = round(time.perf_counter() - t0, 1)
    print("RESULT " + json.dumps(res), flush=True)
    if gpu and os.environ.get("KBIT_E2E_PROFILE", "0") == "1" and model not in ("tiny", "tinymoe"):
        profile_decode(llm, SamplingParams, name)


def profile_decode(llm, sp_cls, name: str, tokens: int = 33) -> None:
    """Where a decode step's GPU time goes, at batch KBIT_E2E_PROFILE_BATCH (default 1): kernels
    (inside CUDA graph replays too) summed over a (tokens)-token generate minus a 1-token one, per
    step; one PROFILE line per kernel. A PROFILE launches line counts the host's launch API calls
    per step (cudaGraphLaunch against kernel launches): a decode step replayed as one FULL graph
    shows about one graph launch and few kernel launches; piecewise or eager steps show many."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    batch = int(os.environ.get("KBIT_E2E_PROFILE_BATCH", "1"))
    prompt = [{"prompt_token_ids": [10 + (7 * i + j) % 1000 for j in range(32)]} for i in range(batch)]

    def kernels(n: int) -> tuple[dict, dict, float]:
        llm.generate(prompt, sp_cls(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            llm.generate(prompt, sp_cls(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
        out: dict = {}
        launches: dict = {}  # host launch API calls by name
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                tot, cnt = out.get(e.name, (0.0, 0))
                out[e.name] = (tot + e.device_time, cnt + 1)  # device_time in us
            elif e.name.startswith("cu") and "Launch" in e.name:
                launches[e.name] = launches.get(e.name, 0) + 1
        return out, launches, wall

    many, many_launches, wall_n = kernels(tokens)
    one, one_launches, wall_1 = kernels(1)
    steps = tokens - 1
    rows = []
    for k, (t, c) in many.items():
        t1, c1 = one.get(k, (0.0, 0))
        rows.append(((t - t1) / steps, (c - c1) / steps, k))
    rows.sort(reverse=True)
    launches = sorted((((c - one_launches.get(k, 0)) / steps, k) for k, c in many_launches.items()), reverse=True)
    total = sum(r[0] for r in rows)
    print(f"PROFILE {name} batch={batch} step_wall_us={(wall_n - wall_1) / steps * 1e6:.0f} "
          f"kernel_sum_us={total:.0f}", flush=True)
    print(f"PROFILE {name} launches per step: "
          + (", ".join(f"{k} {c:.1f}" for c, k in launches) or "none recorded"), flush=True)
    for us, cnt, k in rows[:25]:
        print(f"PROFILE {name} {us:8.1f} us {cnt:6.1f}x {k[:150]}", flush=True)


def reference_of(name: str) -> str | None:
    """The run whose greedy outputs `name`'s should match (module docstring, AGREE), or None."""
    model, config = name.split("_", 1)
    if not model.startswith("tiny"):
        return None
    for prefix in ("kbit", "pre"):
        if config.startswith(prefix) and config[len(prefix):].isdigit():
            return f"{model}_deq{config[len(prefix):]}"
    return f"{model}_awq" if config == "awq_orin" else None


def agreement(results: dict[str, dict]) -> list[str]:
    """AGREE lines for every run in results whose reference_of ran too: prompts with equal greedy
    tokens out of all, and the largest |logprob difference| over each prompt's leading equal tokens."""
    lines = []
    for name, res in results.items():
        ref = results.get(reference_of(name) or "")
        if ref is None or "outputs" not in res or "outputs" not in ref:
            continue
        same, worst = 0, 0.0
        for (toks, lps), (rtoks, rlps) in zip(res["outputs"], ref["outputs"], strict=True):
            same += toks == rtoks
            for t, lp, rt, rlp in zip(toks, lps, rtoks, rlps, strict=True):
                if t != rt:
                    break
                worst = max(worst, abs(lp - rlp))
        lines.append(f"AGREE {name} vs {ref['name']}: {same}/{len(res['outputs'])} prompts with the same "
                     f"greedy tokens, max |logprob diff| {worst:.4f} over equal tokens (tp={res.get('tp', 1)})")
    return lines


def main(names: list[str]) -> None:
    """Each name in its own interpreter, its output passed through; then the AGREE lines.
    KBIT_E2E_CLEAN=1 deletes a folder once no later name reads it (q3moe: 15 GB bf16 + 5 GB awq on a
    64 GB disk)."""
    clean = os.environ.get("KBIT_E2E_CLEAN", "0") == "1"
    results: dict[str, dict] = {}
    for k, name in enumerate(names):
        t = time.perf_counter()
        with subprocess.Popen([sys.executable, __file__, "--child", name], stdout=subprocess.PIPE, text=True) as p:
            assert p.stdout is not None
            for line in p.stdout:
                print(line, end="", flush=True)
                if line.startswith("RESULT "):
                    res = json.loads(line[len("RESULT "):])
                    results[res["name"]] = res
        print(f"== {name}: exit {p.returncode} after {time.perf_counter() - t:.0f} s", flush=True)
        if clean:
            later = {f for n in names[k + 1:] for f in folders_of(n)}
            for f in folders_of(name):
                if f not in later and os.path.isdir(f):
                    shutil.rmtree(f)
                    print(f"== removed {f}", flush=True)
    for line in agreement(results):
        print(line, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
    else:
        main(sys.argv[1:])
