"""kbit / awq_orin inside a real vLLM engine on the GPU, default mode (torch.compile + CUDA graphs).

Run on the GPU machine from the repo root, with vLLM importable (benchmarks/vllm_gpu_run.sh
unpacks the carried bundle and makes the vllm.general_plugins entry point visible):
    python3 benchmarks/vllm_gpu_e2e.py tiny_kbit4 tiny_deq4 bench_bf16 bench_kbit4 ...
Each name is "<model>_<config>": model tiny (2 layers, hidden 256), tinymoe (the same as a
Mixtral with 8 experts, top-2, written in the hub's per-expert layout), bench (Llama-3.2-1B
shapes, random bf16) or l3 (Llama-3-8B shapes, random bf16, ~16 GB); config bf16, deq<k> (kbit
round trip stored as bf16), kbit<k> (online), pre<k> (a kbit folder saved by the HF path), awq
(vLLM's own AWQ), awq_orin. Each engine runs in
its own subprocess (engine core in-process, so the weight-loading peak can be read) and prints one
RESULT JSON line: compile and cudagraph modes, weight memory and the peak while loading, then
greedy outputs with logprobs (tiny), decode tokens/s at batch 1 and 16 (bench), or decode
tokens/s at batch 1, 16, 64 and prefill tokens/s on 2048-token prompts (l3).
"""

from __future__ import annotations

import json
import os
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
}
GIB = 1 << 30


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
    """bf16 source, or its dequantized-kbit / AWQ-RTN variant, written once under ROOT."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    path = f"{ROOT}/{model}_{variant}"
    if os.path.exists(f"{path}/config.json"):
        return path
    common = dict(bos_token_id=1, eos_token_id=2, pad_token_id=3, max_position_embeddings=4096,
                  torch_dtype="bfloat16")
    torch.manual_seed(0)
    if model == "tinymoe":
        cfg, state = moe_state(common)
        net = None
    else:
        cfg = LlamaConfig(**common, **SHAPES[model])
        with torch.device("cuda"):
            net = LlamaForCausalLM(cfg).to(torch.bfloat16)
        state = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    lin = [k for k in state if ".layers." in k and (k.endswith("_proj.weight") or ".experts." in k)]
    if variant.startswith("deq"):
        from kbit_vllm import normal_float_codebook, ops

        k = int(variant[3:])
        cb = normal_float_codebook(k, "cuda")
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
        cfg.torch_dtype = "float16"
    os.makedirs(path, exist_ok=True)
    cfg.save_pretrained(path)
    if variant == "awq":
        c = json.load(open(f"{path}/config.json"))
        c["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                                    "version": "gemm"}
        json.dump(c, open(f"{path}/config.json", "w"), indent=1)
    save_file({k: v.cpu() for k, v in state.items()}, f"{path}/model.safetensors", metadata={"format": "pt"})
    save_tokenizer(path, cfg.vocab_size)
    del net, state
    torch.cuda.empty_cache()
    return path


def moe_state(common: dict):
    """Random Mixtral (SHAPES["tinymoe"]) as the hub stores it: per-expert w1/w2/w3, router gate."""
    import torch
    from transformers import MixtralConfig

    cfg = MixtralConfig(**common, **SHAPES["tinymoe"])
    cfg.architectures = ["MixtralForCausalLM"]
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kvd = cfg.num_key_value_heads * (h // cfg.num_attention_heads)

    def rnd(*shape):
        return (torch.randn(*shape, device="cuda") * 0.05).to(torch.bfloat16)

    one = torch.ones(h, dtype=torch.bfloat16, device="cuda")
    st = {"model.embed_tokens.weight": rnd(v, h), "model.norm.weight": one, "lm_head.weight": rnd(v, h)}
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        st[p + "input_layernorm.weight"] = one
        st[p + "post_attention_layernorm.weight"] = one
        for n, o in (("q", h), ("k", kvd), ("v", kvd), ("o", h)):
            st[p + f"self_attn.{n}_proj.weight"] = rnd(o, h)
        st[p + "block_sparse_moe.gate.weight"] = rnd(cfg.num_local_experts, h)
        for e in range(cfg.num_local_experts):
            q = p + f"block_sparse_moe.experts.{e}."
            st[q + "w1.weight"], st[q + "w2.weight"], st[q + "w3.weight"] = rnd(i, h), rnd(h, i), rnd(i, h)
    return cfg, st


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


def child(name: str) -> None:
    from vllm import LLM, SamplingParams

    model, config = name.split("_", 1)
    kw: dict = {}
    if config.startswith("pre"):  # a kbit folder written by the HF path, served as a checkpoint
        kw = dict(quantization="kbit")
        folder = make_prequantized(model, int(config[3:]))
    elif config.startswith("kbit"):
        kw = dict(quantization="kbit",
                  hf_overrides={"quantization_config": {"quant_method": "kbit", "bits": int(config[4:])}})
        folder = make_folder(model, "bf16")
    elif config in ("awq", "awq_orin"):
        kw = dict(quantization=config, dtype="float16")
        folder = make_folder(model, "awq")
    else:
        folder = make_folder(model, config)
    kw.setdefault("dtype", "bfloat16")
    peak = watch_load_peak()
    t0 = time.perf_counter()
    big = model == "l3"
    if big:  # capture the decode sizes measured here only (prefill chunks run compiled, uncaptured);
        # no prefix caching, so repeated prefill prompts are computed every time
        kw["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]}
        kw["enable_prefix_caching"] = False
    llm = LLM(model=folder, gpu_memory_utilization=0.5 if big else 0.45, max_model_len=4096 if big else 1024,
              seed=0, **kw)
    cc = llm.llm_engine.vllm_config.compilation_config
    res: dict = {"name": name, "init_s": round(time.perf_counter() - t0, 1), "compile_mode": str(cc.mode),
                 "cudagraph_mode": str(cc.cudagraph_mode),
                 "quantization": llm.llm_engine.vllm_config.model_config.quantization, **peak}
    if model in ("tiny", "tinymoe"):
        sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
        outs = llm.generate(["w1 w2 w3 w4", "w10 w20 w30", "w5"], sp, use_tqdm=False)
        res["outputs"] = []
        for o in outs:
            c = o.outputs[0]
            lps = [round(float(s[t].logprob), 4) for t, s in zip(c.token_ids, c.logprobs, strict=True)]
            res["outputs"].append([list(c.token_ids), lps])
    else:
        def gen(batch: int, n: int) -> float:
            prompts = [{"prompt_token_ids": [10 + (7 * i + j) % 30000 for j in range(32)]} for i in range(batch)]
            t = time.perf_counter()
            llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
            return time.perf_counter() - t

        for b in (1, 16, 64) if big else (1, 16):
            gen(b, 64)
            t_n = min(gen(b, 128) for _ in range(2))
            t_1 = min(gen(b, 1) for _ in range(2))
            res[f"bs{b}_decode_tok_s"] = round(b * 127 / (t_n - t_1), 1)
        if big:  # prefill: 8 prompts of 2048 tokens, one output token each
            prompts = [{"prompt_token_ids": [10 + (13 * i + 7 * j) % 120000 for j in range(2048)]} for i in range(8)]
            one = SamplingParams(max_tokens=1, temperature=0.0)
            llm.generate(prompts, one, use_tqdm=False)
            ts = []
            for _ in range(3):
                t = time.perf_counter()
                llm.generate(prompts, one, use_tqdm=False)
                ts.append(time.perf_counter() - t)
            res["prefill2048_tok_s"] = round(8 * 2048 / min(ts), 0)
    print("RESULT " + json.dumps(res), flush=True)


def main(names: list[str]) -> None:
    for name in names:
        t = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "--child", name])
        print(f"== {name}: exit {r.returncode} after {time.perf_counter() - t:.0f} s", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
    else:
        main(sys.argv[1:])
