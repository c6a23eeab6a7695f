"""Regenerate benchmarks/ACCURACY.md: what kbit and awq_orin cost the bundled model in accuracy.

Held-out perplexity (the test split of scripts/corpus.py, scored as train_bundled_model.py
scores it: windows of 512 tokens, fp32 compute) of the bundled model at bf16, kbit k = 2..5
through the real HF integration (KbitConfig, kbit_vllm ops), the same weights with an fp16
absmax instead of E4M4 (fake-quantized: the scale's cost in isolation), and awq_orin on an
AutoAWQ-layout checkpoint made by round-to-nearest int4, group 128. Plus weight SQNR per k over
the model's linear layers. CPU is enough (a few minutes).

    python scripts/accuracy.py [--corpus corpus-py3.11.7.json.gz] [--out benchmarks/ACCURACY.md]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

from kbit_vllm import AwqOrinConfig, KbitConfig, normal_float_codebook, ops  # noqa: E402
from kbit_vllm.cli._common import bundled_model  # noqa: E402
from kbit_vllm.formats import BLOCK, dequantize_awq, quantize_awq_rtn  # noqa: E402
from kbit_vllm.formats.kbit import nearest_codes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEQ = 512
CODE_WINDOWS = 128  # as train_bundled_model.py: the code test split is long, 128 windows of it
AWQ_GROUP = 128
# The output projection quantized too (vLLM / HF `lm_head=True`), on an untied copy of the head.
HEAD_ROWS = ("kbit k=4 + lm_head k=4 (untied copy)", "lm_head k=4 only (untied copy; layers float)")


def linear_weights(model) -> dict[str, torch.Tensor]:
    """The decoder's linear weights (what kbit quantizes; embeddings and lm_head stay float)."""
    return {n: m.weight.detach().float() for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and ".layers." in n}


def kbit_e4m4(w: torch.Tensor, k: int) -> torch.Tensor:
    """w through the real kbit ops (E4M4 absmax), dequantized to fp32."""
    cb = normal_float_codebook(k)
    packed, absmax = ops.kbit_quantize(w, cb, k)
    return ops.kbit_dequantize(packed, absmax, cb, k, torch.float32)


def kbit_fp16_absmax(w: torch.Tensor, k: int) -> torch.Tensor:
    """The same codebook quantization with the block absmax kept in fp16 (8 more bits per block)."""
    cb = normal_float_codebook(k)
    out_f, in_f = w.shape
    blocks = w.float().reshape(out_f, in_f // BLOCK, BLOCK)
    scale = blocks.abs().amax(-1, keepdim=True).half().float()
    norm = torch.where(scale > 0, blocks / scale.clamp_min(1e-30), torch.zeros_like(blocks))
    return (cb[nearest_codes(norm, cb).long()] * scale).reshape(out_f, in_f)


def awq_rtn(w: torch.Tensor) -> torch.Tensor:
    qw, qz, s = quantize_awq_rtn(w, AWQ_GROUP)
    return dequantize_awq(qw, qz, s, AWQ_GROUP, torch.float32)


def sqnr_db(ws: dict[str, torch.Tensor], fn) -> tuple[float, float, float]:
    """(SQNR over all layers together, worst layer, best layer) in dB."""
    per, num, den = [], 0.0, 0.0
    for w in ws.values():
        e = float((w.double() - fn(w).double()).square().sum())
        s = float(w.double().square().sum())
        num, den = num + s, den + e
        per.append(10 * math.log10(s / e))
    return 10 * math.log10(num / den), min(per), max(per)


def write_awq_checkpoint(src: Path, dst: Path) -> None:
    """An AutoAWQ "gemm" int4 checkpoint of src (RTN, zero point, group 128), as AutoAWQ lays it out."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, t in load_file(str(src / "model.safetensors")).items():
        mod = key.rsplit(".", 1)[0]
        if key.endswith("_proj.weight") and ".layers." in key:
            out[mod + ".qweight"], out[mod + ".qzeros"], out[mod + ".scales"] = quantize_awq_rtn(t, AWQ_GROUP)
        else:
            out[key] = t
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": AWQ_GROUP, "zero_point": True,
                                  "version": "gemm"}
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))


def write_untied_checkpoint(src: Path, dst: Path) -> None:
    """src with its tied head written out as its own lm_head.weight (a copy of the embeddings), so
    that KbitConfig(lm_head=True) can quantize it (a tied head stays float)."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(src / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    copy_tokenizer(src, dst)


def copy_tokenizer(src: Path, dst: Path) -> None:
    """The files besides weights and config that a derived checkpoint needs to load and score."""
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (dst / f).write_bytes((src / f).read_bytes())


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF model folder (default: the bundled model)")
    p.add_argument("--corpus", default=None, help="frozen corpus (corpus.py --dump); default: this Python's")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "ACCURACY.md"))
    a = p.parse_args(argv)
    t0 = time.time()
    torch.manual_seed(0)
    model_dir = Path(a.model) if a.model else bundled_model()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    backend, eos = tok.backend_tokenizer, tok.eos_token_id

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

    test = {kind: corpus.token_stream(corpus.load("test", (kind,), dump=a.corpus), encode, eos)
            for kind in ("docs", "code")}

    def ppl(model) -> tuple[float, float, int, int]:
        d, nd = corpus.perplexity(model.eval(), test["docs"], SEQ)
        c, nc = corpus.perplexity(model, test["code"], SEQ, max_windows=CODE_WINDOWS)
        return d, c, nd, nc

    def load(**kw):
        return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **kw)

    rows: list[tuple[str, float, tuple[float, float, int, int]]] = []

    def add(name: str, bits: float, model) -> None:
        r = ppl(model)
        rows.append((name, bits, r))
        print(f"{name:<32} {bits:6.3f} bits  docs {r[0]:.3f}  code {r[1]:.3f}  ({time.time() - t0:.0f}s)", flush=True)

    base = load()
    ws = linear_weights(base)
    n_lin = sum(w.numel() for w in ws.values())
    add("bf16 (reference)", 16, base)
    for k in (5, 4, 3, 2):
        add(f"kbit k={k} (E4M4 absmax)", k + 8 / BLOCK, load(quantization_config=KbitConfig(bits=k)))
        fake = load()
        with torch.no_grad():
            for n, m in fake.named_modules():
                if n in ws:
                    m.weight.copy_(kbit_fp16_absmax(ws[n], k))
        add(f"kbit k={k}, fp16 absmax (fake-quant)", k + 16 / BLOCK, fake)
    with tempfile.TemporaryDirectory() as tmp:
        awq_dir = Path(tmp) / "awq"
        write_awq_checkpoint(model_dir, awq_dir)
        copy_tokenizer(model_dir, awq_dir)
        awq = AutoModelForCausalLM.from_pretrained(str(awq_dir), quantization_config=AwqOrinConfig(),
                                                   dtype=torch.float32)
        add(f"awq_orin int4 RTN, group {AWQ_GROUP}", 4 + (16 + 4) / AWQ_GROUP, awq)
        untied = Path(tmp) / "untied"
        write_untied_checkpoint(model_dir, untied)

        def load_untied(**kw):
            return AutoModelForCausalLM.from_pretrained(str(untied), dtype=torch.float32, **kw)

        add(HEAD_ROWS[0], 4 + 8 / BLOCK, load_untied(quantization_config=KbitConfig(bits=4, lm_head=True)))
        add(HEAD_ROWS[1], 4 + 8 / BLOCK, load_untied(
            quantization_config=KbitConfig(bits=4, lm_head=True, modules_to_not_convert=["model.layers"])))

    sq = {k: (sqnr_db(ws, lambda w, k=k: kbit_e4m4(w, k)), sqnr_db(ws, lambda w, k=k: kbit_fp16_absmax(w, k)))
          for k in (2, 3, 4, 5)}
    sq_awq = sqnr_db(ws, awq_rtn)
    head_numel = base.get_output_embeddings().weight.numel()
    write_md(Path(a.out), a, model_dir, rows, sq, sq_awq, n_lin, len(ws), head_numel, time.time() - t0)
    print(f"wrote {a.out} in {time.time() - t0:.0f}s")
    return 0


def write_md(path: Path, a: argparse.Namespace, model_dir: Path, rows, sq, sq_awq, n_lin: int, n_layers: int,
             head_numel: int, seconds: float) -> None:
    import transformers

    card = json.loads((model_dir / "train_log.json").read_text()) if (model_dir / "train_log.json").is_file() else {}
    ref_d, ref_c = rows[0][2][0], rows[0][2][1]
    nd, nc = rows[0][2][2], rows[0][2][3]
    src = corpus.source_python(a.corpus)
    lines = [
        "# Accuracy of kbit and awq_orin on the bundled model",
        "",
        f"Generated by `python scripts/accuracy.py{' --corpus ' + Path(a.corpus).name if a.corpus else ''}` "
        f"({seconds:.0f} s on {platform.machine()} CPU; torch {torch.__version__}, transformers "
        f"{transformers.__version__}). Do not edit by hand.",
        "",
        f"Model: the bundled `kbit_vllm/data/model` ({card.get('params_m', float('nan')):.2f} M parameters, "
        f"{n_layers} linear layers with {n_lin / 1e6:.2f} M weights quantized; embeddings, tied lm_head and "
        "norms stay float; see its README.md). Test split of the Python "
        f"{src} docs + stdlib corpus (`scripts/corpus.py`, never seen in training): {nd:,} prose tokens "
        f"(pydoc topics) and {nc:,} code tokens ({CODE_WINDOWS} windows), windows of {SEQ}, fp32 compute.",
        "",
        "## Held-out perplexity",
        "",
        "Bits per weight count the codes and the per-block scale (kbit: 32 weights per block; AWQ: "
        f"an fp16 scale and a 4-bit zero per {AWQ_GROUP} weights). kbit rows run the real HF integration "
        "(`KbitConfig`, `kbit_vllm::kbit_linear`); fp16-absmax rows are the same codebook quantization "
        "with the block scale kept in fp16, applied to the weights directly; awq_orin loads an "
        "AutoAWQ-layout checkpoint (round-to-nearest int4, zero point, no activation-aware scaling) "
        "through `AwqOrinConfig`. The lm_head rows load the model with its tied head written out as "
        "an untied copy (same weights) and `KbitConfig(bits=4, lm_head=True)`: with the decoder layers "
        f"at k=4, and alone (`modules_to_not_convert=[\"model.layers\"]`); the head is "
        f"{head_numel / 1e6:.2f} M weights, {100 * head_numel / (head_numel + n_lin):.0f}% of the "
        "quantizable ones here (Llama-3-8B: 0.53 B, 7%).",
        "",
        "| weights | bits/weight | ppl docs | vs bf16 | ppl code | vs bf16 |",
        "|---|---|---|---|---|---|",
    ]
    for name, bits, (d, c, _, _) in rows:
        lines.append(f"| {name} | {bits:.3f} | {d:.3f} | {100 * (d / ref_d - 1):+.1f}% | {c:.3f} | "
                     f"{100 * (c / ref_c - 1):+.1f}% |")
    lines += [
        "",
        "## Weight SQNR per k",
        "",
        "10·log10(Σw² / Σ(w − ŵ)²) over all quantized layers together, and the worst / best single layer.",
        "",
        "| k | SQNR dB (E4M4 absmax) | worst | best | SQNR dB (fp16 absmax) | E4M4 cost dB |",
        "|---|---|---|---|---|---|",
    ]
    for k in (2, 3, 4, 5):
        (e, lo, hi), (f, _, _) = sq[k]
        lines.append(f"| {k} | {e:.2f} | {lo:.2f} | {hi:.2f} | {f:.2f} | {f - e:.2f} |")
    lines += [
        f"| awq_orin (int4 RTN, g{AWQ_GROUP}) | {sq_awq[0]:.2f} | {sq_awq[1]:.2f} | {sq_awq[2]:.2f} | - | - |",
        "",
        "## The cost of E4M4 absmax",
        "",
        "E4M4 stores each block's scale in 8 bits instead of 16 (0.25 instead of 0.5 bits per weight). "
        "Quantization divides by the decoded E4M4 scale, so the codes absorb part of its rounding; "
        "the columns above compare it with an fp16 scale at the same k:",
        "",
    ]
    for k in (2, 3, 4, 5):
        e4 = next(r for r in rows if r[0].startswith(f"kbit k={k} (E4M4"))
        f16 = next(r for r in rows if r[0].startswith(f"kbit k={k}, fp16"))
        lines.append(f"- k={k}: SQNR {sq[k][1][0] - sq[k][0][0]:+.2f} dB for fp16; perplexity docs "
                     f"{e4[2][0]:.3f} (E4M4) vs {f16[2][0]:.3f} (fp16), code {e4[2][1]:.3f} vs {f16[2][1]:.3f}.")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
