"""`kbit-vllm quantize SRC OUT --bits K`: an HF float checkpoint in, a kbit checkpoint out.

Quantizes through the Hugging Face path (from_pretrained with KbitConfig, then save_pretrained),
so the output is exactly what transformers reloads and what `vllm serve OUT --quantization kbit`
loads as pre-quantized. Then measures each quantized layer against the source weights.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ._common import mib, weight_file_bytes

# Files besides the weights that a serving engine needs next to config.json.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                    "vocab.json", "merges.txt", "chat_template.jinja", "generation_config.json")
REPORT_NAME = "kbit_quantize_report.json"


@dataclass
class LayerError:
    """One quantized linear: its shape and the weight signal-to-quantization-noise ratio."""

    name: str
    out_features: int
    in_features: int
    sqnr_db: float | None  # None where the source tensor could not be matched by name


@dataclass
class QuantizeReport:
    """What `quantize` did, saved next to the checkpoint (the demo reads it back)."""

    src: str
    out: str
    bits: int
    dtype: str
    bytes_before: int  # weight files of SRC
    bytes_after: int  # weight files of OUT
    linear_bytes_float: int  # the quantized layers' weights in `dtype`
    linear_bytes_kbit: int  # the same layers as packed codes + E4M4 absmax
    seconds: float
    modules_to_not_convert: list[str] = field(default_factory=list)
    layers: list[LayerError] = field(default_factory=list)

    @classmethod
    def load(cls, folder: Path) -> QuantizeReport | None:
        path = Path(folder) / REPORT_NAME
        if not path.is_file():
            return None
        d = json.loads(path.read_text())
        d["layers"] = [LayerError(**x) for x in d.get("layers", [])]
        return cls(**d)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("quantize", help="quantize an HF checkpoint folder to kbit (loads in transformers and vLLM)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="HF model folder (fp16/bf16/fp32 safetensors)")
    p.add_argument("out", help="output folder (created)")
    p.add_argument("--bits", type=int, default=4, choices=(2, 3, 4, 5), help="bits per weight (default 4)")
    p.add_argument("--modules-to-not-convert", nargs="*", default=None, metavar="NAME",
                   help="layers kept in float (name suffix or regex, transformers semantics); lm_head is unless "
                        "--lm-head")
    p.add_argument("--lm-head", action="store_true",
                   help="quantize lm_head too (an untied one; tied embeddings stay float)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"),
                   help="dtype of the layers left in float and of the activations (default bfloat16)")
    p.add_argument("--device", default="cpu", help="where to quantize: cpu (default) or cuda")
    p.add_argument("--force", action="store_true", help="write into OUT even if it holds a checkpoint")
    return p


def _source_tensors(src: Path):
    """name -> (file, key) for every tensor of the source safetensors (sharded or not)."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for f in sorted(src.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                where[k] = f
    return where


def _sqnr_db(w, wq) -> float:
    num = float(w.double().square().sum())
    den = float((w.double() - wq.double()).square().sum())
    return math.inf if den == 0 else 10 * math.log10(num / den) if num > 0 else -math.inf


def quantize_folder(src: str | Path, out: str | Path, bits: int = 4, modules_to_not_convert: list[str] | None = None,
                    dtype: str = "bfloat16", device: str = "cpu", progress: bool = True,
                    lm_head: bool = False) -> QuantizeReport:
    """Quantize SRC into OUT and return the report (also written to OUT/kbit_quantize_report.json)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from kbit_vllm import KbitConfig
    from kbit_vllm.layers.hf_linear import KbitLinear

    src, out = Path(src), Path(out)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} is not a Hugging Face model folder (no config.json)")
    if not any(src.glob("*.safetensors")):
        raise FileNotFoundError(f"{src} holds no .safetensors weights")
    t0 = time.time()
    torch_dtype = getattr(torch, dtype)
    qc = KbitConfig(bits=bits, modules_to_not_convert=modules_to_not_convert, lm_head=lm_head)
    print(f"quantizing {src} to kbit k={bits} ({dtype} elsewhere) on {device}", flush=True)
    model = AutoModelForCausalLM.from_pretrained(str(src), quantization_config=qc, dtype=torch_dtype,
                                                 device_map=device)
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, KbitLinear)]
    if not layers:
        raise ValueError(f"{src}: no linear layer was quantized (everything matched modules_to_not_convert?)")

    where = _source_tensors(src)
    errors: list[LayerError] = []
    lin_float = lin_kbit = 0
    items = layers
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(layers, desc="kbit error per layer", unit="layer", file=sys.stdout)
    for name, m in items:
        packed, absmax = m.serialized()
        lin_kbit += packed.numel() * 4 + absmax.numel()
        lin_float += m.out_features * m.in_features * torch_dtype.itemsize
        key = name + ".weight"
        sqnr = None
        if key in where:
            with safe_open(str(where[key]), framework="pt") as h:
                w = h.get_tensor(key).float()
            if tuple(w.shape) == (m.out_features, m.in_features):
                sqnr = _sqnr_db(w, m.dequantize(torch.float32).cpu())
        errors.append(LayerError(name, m.out_features, m.in_features, sqnr))

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    for fname in _TOKENIZER_FILES:
        if (src / fname).is_file() and not (out / fname).is_file():
            shutil.copy2(src / fname, out / fname)
    report = QuantizeReport(
        src=str(src), out=str(out), bits=bits, dtype=dtype, bytes_before=weight_file_bytes(src),
        bytes_after=weight_file_bytes(out), linear_bytes_float=lin_float, linear_bytes_kbit=lin_kbit,
        seconds=time.time() - t0, modules_to_not_convert=_resolved_skips(model, qc), layers=errors)
    (out / REPORT_NAME).write_text(json.dumps(asdict(report), indent=1))
    return report


def _resolved_skips(model, qc) -> list[str]:
    """The skip list transformers resolved (lm_head, tied embeddings added), as saved in config.json."""
    saved = getattr(model.config, "quantization_config", None) or qc
    skips = saved.get("modules_to_not_convert") if isinstance(saved, dict) else saved.modules_to_not_convert
    return list(skips or [])


def _kind(name: str) -> str:
    """Layer type for grouping: the last name component (q_proj, down_proj, ...)."""
    return name.rsplit(".", 1)[-1]


def print_report(r: QuantizeReport, worst: int = 3) -> None:
    """Size before/after and a per-layer-type SQNR summary (every layer when there are few)."""
    known = [e for e in r.layers if e.sqnr_db is not None]
    print(f"\nquantized {len(r.layers)} linear layers to k={r.bits} in {r.seconds:.1f} s "
          f"(kept in {r.dtype}: {', '.join(r.modules_to_not_convert) or 'none'})")
    if len(r.layers) <= 16:
        print(f"\n{'layer':<40} {'out x in':>12} {'SQNR dB':>8}")
        for e in r.layers:
            sq = "-" if e.sqnr_db is None else f"{e.sqnr_db:.2f}"
            print(f"{e.name:<40} {f'{e.out_features}x{e.in_features}':>12} {sq:>8}")
    else:
        print(f"\n{'layer type':<16} {'count':>5} {'mean SQNR dB':>13} {'min':>7} {'max':>7}")
        for kind in sorted({_kind(e.name) for e in known}):
            v = [e.sqnr_db for e in known if _kind(e.name) == kind]
            print(f"{kind:<16} {len(v):>5} {sum(v) / len(v):>13.2f} {min(v):>7.2f} {max(v):>7.2f}")
        for e in sorted(known, key=lambda e: e.sqnr_db)[:worst]:
            print(f"  lowest: {e.name} {e.sqnr_db:.2f} dB")
    if known:
        print(f"{'all layers':<16} {len(known):>5} {sum(e.sqnr_db for e in known) / len(known):>13.2f} dB mean SQNR")
    if len(known) < len(r.layers):
        print(f"({len(r.layers) - len(known)} layers not matched to a source tensor by name; no SQNR)")
    print(f"\nquantized layers: {mib(r.linear_bytes_float)} {r.dtype} -> {mib(r.linear_bytes_kbit)} kbit "
          f"({r.linear_bytes_float / max(r.linear_bytes_kbit, 1):.2f}x smaller)")
    print(f"checkpoint weights: {mib(r.bytes_before)} -> {mib(r.bytes_after)} "
          f"({r.bytes_before / max(r.bytes_after, 1):.2f}x smaller; embeddings and norms stay in float)")
    print(f"wrote {r.out}: load with AutoModelForCausalLM.from_pretrained (after `import kbit_vllm`) "
          f"or `vllm serve {r.out} --quantization kbit`")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and (out / "config.json").exists() and not args.force:
        print(f"error: {out} already holds a checkpoint (pass --force to overwrite)", file=sys.stderr)
        return 2
    try:
        report = quantize_folder(args.src, out, args.bits, args.modules_to_not_convert, args.dtype, args.device,
                                 lm_head=args.lm_head)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_report(report)
    return 0
