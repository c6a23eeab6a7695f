"""Train the small causal LM that ships with kbit_vllm (the demo's model and ACCURACY.md's subject).

Why a trained model: random weights answer with noise and their perplexity means nothing, so
the demo and the accuracy tables need a real one, small enough to ship inside the package and
trainable offline. The text is Python's own (pydoc_data topics + stdlib sources, see corpus.py);
the tokenizer is a byte-level BPE trained here with `tokenizers`; the model is a
LlamaForCausalLM whose linear layers all have in/out dims that are multiples of 128, so kbit
(blocks of 32) and AWQ (groups of 128) can quantize every one of them.

Needs torch, transformers and tokenizers only (no vLLM, no datasets, no internet). The data is
small (about 8 M tokens) next to what a GPU chews through in a minute, so the run is sized in
epochs (--epochs; the learning rate anneals over them) with a wall-clock cap (--budget-s), uses
residual dropout, evaluates every few seconds and keeps the weights with the best validation
loss (bf16 autocast on CUDA, fp32 on CPU). It writes an HF folder: config, model.safetensors
(bf16), tokenizer files, README.md (model card with this recipe and the results) and
train_log.json.

    python3 scripts/corpus.py --dump corpus.json.gz     # once, on a Python with a full stdlib
    PYTHONPATH=. python3 scripts/train_bundled_model.py --corpus corpus.json.gz --out OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from pathlib import Path

import corpus  # scripts/corpus.py (this script's folder is on sys.path)
import torch
import torch.nn.functional as F

EOT = "<|endoftext|>"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--corpus", default=None,
                   help="a corpus.py --dump file (default: this Python's own pydoc_data and stdlib)")
    p.add_argument("--epochs", type=float, default=8.0,
                   help="passes over the training stream; the learning rate anneals over them")
    p.add_argument("--budget-s", type=float, default=150.0,
                   help="wall-clock cap on training (after data prep); stops early if the epochs take longer")
    p.add_argument("--dropout", type=float, default=0.1,
                   help="dropout on the embeddings and on every attention / MLP output while training")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--inter", type=int, default=768, help="MLP intermediate size")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=512, help="training context (= max_position_embeddings)")
    p.add_argument("--batch", type=int, default=64, help="sequences per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--docs-repeat", type=int, default=4,
                   help="times the prose (pydoc topics) appears in the training stream, vs once for code")
    p.add_argument("--max-train-mb", type=float, default=None,
                   help="cap the training text (MB of code; for quick local tests)")
    p.add_argument("--eval-every-s", type=float, default=3.0)
    p.add_argument("--eval-windows", type=int, default=128)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def check_dims(a: argparse.Namespace) -> None:
    """Every linear layer's in/out must be a multiple of 128 (kbit blocks of 32, AWQ groups of 128)."""
    head_dim = a.hidden // a.heads
    dims = {"hidden": a.hidden, "inter": a.inter, "kv out": a.kv_heads * head_dim}
    bad = {k: v for k, v in dims.items() if v % 128}
    if bad or a.hidden % a.heads or a.heads % a.kv_heads:
        sys.exit(f"dims must be multiples of 128 and heads must divide evenly: {dims}, heads {a.heads}/{a.kv_heads}")


def train_tokenizer(texts: list[str], vocab: int, seq: int):
    """Byte-level BPE (any text encodes, no unknown token); EOT marks document starts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    eot = tok.token_to_id(EOT)
    # A prompt starts the way every training document did: right after EOT.
    tok.post_processor = processors.TemplateProcessing(single=f"{EOT} $A", pair=f"{EOT} $A {EOT} $B",
                                                       special_tokens=[(EOT, eot)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT,
                                   model_max_length=seq)


def encoder(hf_tok):
    """docs -> token ids without specials, using the fast tokenizer's parallel batch encode."""
    backend = hf_tok.backend_tokenizer

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

    return encode


def add_dropout(model, p: float) -> None:
    """Residual dropout through forward hooks, so the saved model stays a plain LlamaForCausalLM.

    HF Llama has attention-probability dropout only; on a few MB of text a 4 M model memorizes
    within a few epochs without dropout on the embedding and on each residual branch.
    """
    if p <= 0:
        return

    def hook(mod, _inp, out):
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, mod.training),) + tuple(out[1:])
        return F.dropout(out, p, mod.training)

    model.model.embed_tokens.register_forward_hook(hook)
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(hook)
        layer.mlp.register_forward_hook(hook)


def lr_at(frac: float, peak: float) -> float:
    """Linear warmup over the first 3% of the run, then cosine down to 10% of peak."""
    warm = min(1.0, frac / 0.03)
    return peak * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0))))


def evaluate(model, ids: torch.Tensor, seq: int, windows: int, device: str, amp: bool) -> float:
    """Mean next-token loss over the first `windows` non-overlapping windows of ids."""
    n = min(windows, len(ids) // seq)
    x = ids[: n * seq].view(n, seq).to(device)
    model.eval()
    total = 0.0
    with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=amp):
        for i in range(0, n, 16):
            xb = x[i:i + 16]
            logits = model(input_ids=xb).logits.float()
            total += float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1),
                                           reduction="sum"))
    model.train()
    return total / (n * (seq - 1))


def _pct(by_kind: dict[str, int]) -> str:
    return " / ".join(f"{v}% of {k}" for k, v in by_kind.items())


def model_card(a: argparse.Namespace, log: dict) -> str:
    """README.md of the output folder: what it is, how it was made, how well it does."""
    r = log["result"]
    return f"""# kbit-pydoc-{log['params_m']:.1f}m

A small causal language model shipped with kbit_vllm so that `kbit-vllm demo` answers in words
and the perplexities in `benchmarks/ACCURACY.md` mean something. It writes Python-documentation
English and Python code; it is not an assistant and knows nothing beyond Python's own docs and
standard library.

- Architecture: LlamaForCausalLM, hidden {a.hidden}, {a.layers} layers, {a.heads} heads
  ({a.kv_heads} KV heads), MLP {a.inter}, vocab {log['vocab']}, context {a.seq}, tied embeddings;
  {log['params_m']:.2f} M parameters, bf16 safetensors.
- Tokenizer: byte-level BPE ({log['vocab']} tokens, `{EOT}` = bos/eos/pad), trained by the
  script on the training split; the tokenizer prepends `{EOT}` to every prompt, as every
  training document started after one.
- Data: pydoc_data topics (the language reference behind `help()`, x{a.docs_repeat} in the
  stream) and the standard library's .py sources (tests included; pydoc_data, encodings and
  files over {corpus.MAX_FILE_BYTES // 1000} kB left out) of Python {log['corpus_python']}.
  Split by an md5 of each document's name: {_pct(corpus.TEST_PERCENT)} test,
  {_pct(corpus.VAL_PERCENT)} validation, the rest training ({log['train_tokens']:,} training tokens).
- Training: `scripts/train_bundled_model.py` (kbit_vllm repository), {log['device']},
  {log['steps']:,} steps of {a.batch} x {a.seq} tokens in {log['train_s']:.0f} s
  ({log['tokens_seen'] / 1e6:.0f} M tokens, {log['epochs']:.1f} epochs of the stream), AdamW lr {a.lr}
  (3% warmup, cosine to 10% over {a.epochs:g} epochs), weight decay {a.weight_decay}, dropout
  {a.dropout} (embeddings and residual branches), grad clip 1.0, {log['precision']}, seed {a.seed};
  the weights with the best validation loss were kept (step {log['best_step']:,},
  epoch {log['best_epoch']:.1f}).
- Result: validation loss {r['val_loss']:.3f}; test perplexity {r['test_ppl_docs']:.2f} on prose
  (docs) and {r['test_ppl_code']:.2f} on code, measured in fp32 after the bf16 save.
- Versions: torch {torch.__version__}, transformers {log['transformers']}, tokenizers {log['tokenizers']}.
- License: trained on text from the Python distribution (PSF License); released with kbit_vllm.

Greedy sample, repetition penalty 1.2 (prompt `{log['sample_prompt']}`):

```
{log['sample']}
```
"""


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    check_dims(a)
    import tokenizers
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    random.seed(a.seed)
    torch.manual_seed(a.seed)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    src = a.corpus
    train_docs, val_docs = corpus.load("train", dump=src), corpus.load("val", dump=src)
    test_prose, test_code = corpus.load("test", ("docs",), src), corpus.load("test", ("code",), src)
    code_mb = sum(len(d.text) for d in train_docs if d.kind == "code") / 1e6
    if code_mb < 1.0:
        sys.exit(f"only {code_mb:.2f} MB of stdlib .py sources found; this Python ships no sources?")
    if a.max_train_mb is not None:
        kept, size = [], 0
        for d in train_docs:
            if d.kind == "docs" or size < a.max_train_mb * 1e6:
                kept.append(d)
                size += len(d.text) if d.kind == "code" else 0
        train_docs = kept
    n_test = len(test_prose) + len(test_code)
    print(f"corpus: Python {corpus.source_python(src)}, {len(train_docs)} train / {len(val_docs)} val / "
          f"{n_test} test docs, {sum(len(d.text) for d in train_docs) / 1e6:.1f} MB train text", flush=True)

    hf_tok = train_tokenizer([d.text for d in train_docs], a.vocab, a.seq)
    eos = hf_tok.eos_token_id
    encode = encoder(hf_tok)
    prose = [d for d in train_docs if d.kind == "docs"]
    code = [d for d in train_docs if d.kind == "code"]
    train_ids = torch.tensor(corpus.token_stream(prose * a.docs_repeat + code, encode, eos), dtype=torch.long)
    val_ids = torch.tensor(corpus.token_stream(val_docs, encode, eos), dtype=torch.long)
    unique_train = len(corpus.token_stream(train_docs, encode, eos))
    print(f"tokenizer: vocab {len(hf_tok)}; {len(train_ids):,} train tokens in the stream ({unique_train:,} unique), "
          f"{len(val_ids):,} val; data ready at {time.time() - t0:.0f}s", flush=True)

    cfg = LlamaConfig(vocab_size=len(hf_tok), hidden_size=a.hidden, intermediate_size=a.inter,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=a.seq, tie_word_embeddings=True, bos_token_id=eos,
                      eos_token_id=eos, pad_token_id=eos, rope_theta=10000.0)
    model = LlamaForCausalLM(cfg).to(a.device)
    add_dropout(model, a.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters on {a.device}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay,
                             "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), fused=a.device == "cuda")
    fwd = torch.compile(model) if a.compile else model
    amp = a.device.startswith("cuda")
    train_gpu = train_ids.to(a.device)
    offsets = torch.arange(a.seq, device=a.device)
    g = torch.Generator(device=a.device).manual_seed(a.seed)

    best = (float("inf"), 0, None, 0.0)
    total_tokens = a.epochs * len(train_ids)
    steps, tokens_seen, last_eval, loss_ema = 0, 0, 0.0, None
    curve: list[dict] = []
    start = time.time()
    while True:
        elapsed = time.time() - start
        frac = max(elapsed / a.budget_s, tokens_seen / total_tokens)
        if elapsed - last_eval >= a.eval_every_s or frac >= 1.0:
            vl = evaluate(model, val_ids, a.seq, a.eval_windows, a.device, amp)
            epoch = tokens_seen / len(train_ids)
            curve.append({"t": round(elapsed, 1), "step": steps, "epoch": round(epoch, 2), "train_loss": loss_ema,
                          "val_loss": vl})
            print(f"t={elapsed:6.1f}s step {steps:6d} epoch {epoch:5.2f} train {loss_ema or float('nan'):.3f} "
                  f"val {vl:.3f}", flush=True)
            if vl < best[0]:
                best = (vl, steps, {k: v.detach().clone() for k, v in model.state_dict().items()}, epoch)
            last_eval = elapsed
            if frac >= 1.0:
                break
        for group in opt.param_groups:
            group["lr"] = lr_at(frac, a.lr)
        starts = torch.randint(0, len(train_gpu) - a.seq, (a.batch,), device=a.device, generator=g)
        x = train_gpu[starts[:, None] + offsets]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=amp):
            logits = fwd(input_ids=x).logits
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        steps += 1
        tokens_seen += x.numel()
        if steps % 50 == 0 or loss_ema is None:
            lv = loss.detach().item()
            loss_ema = lv if loss_ema is None else 0.8 * loss_ema + 0.2 * lv
    model.load_state_dict(best[2])
    train_s = time.time() - start
    print(f"trained {steps} steps ({tokens_seen / len(train_ids):.1f} epochs) in {train_s:.0f}s; "
          f"best val {best[0]:.3f} at step {best[1]} (epoch {best[3]:.1f})", flush=True)

    model.to(torch.bfloat16).save_pretrained(str(out))
    hf_tok.save_pretrained(str(out))
    # Score what was saved: reload the bf16 folder, run in fp32.
    saved = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).to(a.device).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    ppl_docs, n_docs = corpus.perplexity(saved, corpus.token_stream(test_prose, encode, eos), a.seq)
    ppl_code, n_code = corpus.perplexity(saved, corpus.token_stream(test_code, encode, eos), a.seq, max_windows=128)
    prompt = 'The "with" statement'
    enc = tok(prompt, return_tensors="pt").to(a.device)
    gen = saved.generate(**enc, max_new_tokens=48, do_sample=False, repetition_penalty=1.2)
    sample = tok.decode(gen[0], skip_special_tokens=True)
    print(f"test ppl: docs {ppl_docs:.2f} ({n_docs} tokens), code {ppl_code:.2f} ({n_code} tokens)")
    print(f"sample: {sample!r}")

    log = {
        "params_m": n_params / 1e6, "vocab": len(hf_tok), "device": (torch.cuda.get_device_name(a.device)
                                                                    if amp else "CPU"),
        "precision": "bf16 autocast" if amp else "fp32", "steps": steps, "tokens_seen": tokens_seen,
        "train_tokens": unique_train,
        "epochs": tokens_seen / max(len(train_ids), 1), "best_step": best[1], "best_epoch": best[3],
        "train_s": train_s, "corpus_python": corpus.source_python(src),
        "result": {"val_loss": best[0], "test_ppl_docs": ppl_docs, "test_tokens_docs": n_docs,
                   "test_ppl_code": ppl_code, "test_tokens_code": n_code},
        "sample_prompt": prompt, "sample": sample, "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "args": vars(a), "curve": curve, "total_s": time.time() - t0,
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=1))
    (out / "README.md").write_text(model_card(a, log))
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"wrote {out} ({size / 2**20:.1f} MiB) in {time.time() - t0:.0f}s total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
