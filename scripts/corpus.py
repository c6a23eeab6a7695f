"""The bundled model's text: Python's own docs (pydoc_data topics) and standard-library sources.

Both ship with every CPython, so the model can be trained on a machine with no internet and
its perplexity re-measured anywhere. The split is a hash of each document's name (the topic
key or the path inside the stdlib), not of its content or position, so a document held out
on one Python version is held out on every other one too, even where the files differ.
Used by train_bundled_model.py and accuracy.py (both in this folder).

Python builds differ a lot in what they ship (a distro python3 may leave out the tests and
half the sources), so the corpus can be frozen: `python3 scripts/corpus.py --dump FILE.json.gz`
writes every document with its split to one gzipped JSON file (about 6 MB from a full
CPython 3.11), and `load(..., dump=FILE)` / `--corpus FILE` in the other scripts read it back.

    python3 scripts/corpus.py --dump corpus-py3.11.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import platform
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Percent of documents held out, per kind. Prose is scarce (79 topics), so more of it is held
# out to give the docs perplexity enough tokens.
TEST_PERCENT = {"docs": 15, "code": 5}  # hash % 100 below this: test (perplexity in ACCURACY.md)
VAL_PERCENT = {"docs": 3, "code": 3}  # the next ones: validation (model selection while training)
MAX_FILE_BYTES = 200_000  # generated tables (unicode data, big test fixtures) are not language
SKIP_DIRS = ("site-packages", "dist-packages", "pydoc_data", "encodings", "__pycache__")


@dataclass(frozen=True)
class Doc:
    """One document: its stable name, its kind ("docs" prose or "code"), and its text."""

    name: str
    kind: str
    text: str


def split_of(name: str, kind: str) -> str:
    """'test', 'val' or 'train' from a stable hash of the document name."""
    h = int(hashlib.md5(name.encode()).hexdigest()[:8], 16) % 100
    if h < TEST_PERCENT[kind]:
        return "test"
    return "val" if h < TEST_PERCENT[kind] + VAL_PERCENT[kind] else "train"


def topic_docs() -> list[Doc]:
    """pydoc_data's topics: the language reference text behind help('for') and friends."""
    from pydoc_data.topics import topics

    return [Doc(f"topics/{key}", "docs", text.strip() + "\n") for key, text in sorted(topics.items())]


def source_docs(stdlib: Path | None = None) -> list[Doc]:
    """Every readable .py file of the standard library (tests included), minus generated tables."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(part in SKIP_DIRS for part in rel.split("/")[:-1]):
            continue
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            docs.append(Doc(f"stdlib/{rel}", "code", text))
    return docs


def load(split: str, kinds: tuple[str, ...] = ("docs", "code"), dump: str | Path | None = None) -> list[Doc]:
    """The documents of one split, docs first, each kind sorted by name; from `dump` if given,
    else from this Python's own pydoc_data and stdlib."""
    if dump is not None:
        return [d for d in read_dump(dump)[1] if d.kind in kinds and split_of(d.name, d.kind) == split]
    out = []
    if "docs" in kinds:
        out += [d for d in topic_docs() if split_of(d.name, d.kind) == split]
    if "code" in kinds:
        out += [d for d in source_docs() if split_of(d.name, d.kind) == split]
    return out


def write_dump(path: str | Path) -> dict:
    """Freeze this Python's corpus (all splits) into one gzipped JSON file; returns its header."""
    docs = topic_docs() + source_docs()
    header = {"python": platform.python_version(), "docs": len(docs),
              "chars": sum(len(d.text) for d in docs), "test_percent": TEST_PERCENT, "val_percent": VAL_PERCENT}
    body = {"header": header, "docs": [[d.name, d.kind, d.text] for d in docs]}
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(body, f)
    return header


_DUMPS: dict[str, tuple[dict, list[Doc]]] = {}


def read_dump(path: str | Path) -> tuple[dict, list[Doc]]:
    """(header, documents) of a dump, cached: the training script reads it once per split."""
    key = str(Path(path).resolve())
    if key not in _DUMPS:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            body = json.load(f)
        _DUMPS[key] = (body["header"], [Doc(name, kind, text) for name, kind, text in body["docs"]])
    return _DUMPS[key]


def source_python(dump: str | Path | None = None) -> str:
    """The Python version whose docs and sources make up the corpus."""
    return read_dump(dump)[0]["python"] if dump is not None else platform.python_version()


def token_stream(docs: list[Doc], encode, eos_id: int) -> list[int]:
    """Documents as one token list, each one preceded by eos (as the model saw them in training)."""
    ids: list[int] = []
    for doc_ids in encode([d.text for d in docs]):
        ids.append(eos_id)
        ids.extend(doc_ids)
    return ids


def perplexity(model, ids: list[int], seq: int, max_windows: int | None = None, batch: int = 8) -> tuple[float, int]:
    """exp(mean next-token NLL) over non-overlapping windows of seq tokens; (ppl, tokens scored).

    Each window is scored on its own (no carried context), so the first token of a window is
    never a target. Deterministic: same ids, same windows.
    """
    import math

    import torch

    n = len(ids) // seq
    if max_windows is not None:
        n = min(n, max_windows)
    if n == 0:
        raise ValueError(f"perplexity: need at least {seq} tokens, got {len(ids)}")
    device = next(model.parameters()).device
    windows = torch.tensor(ids[: n * seq], dtype=torch.long).view(n, seq)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n, batch):
            x = windows[i:i + batch].to(device)
            logits = model(input_ids=x).logits.float()
            nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                    x[:, 1:].reshape(-1), reduction="sum")
            total += float(nll)
            count += x[:, 1:].numel()
    return math.exp(total / count), count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Freeze this Python's docs + stdlib corpus into one file.")
    p.add_argument("--dump", required=True, help="output file (.json.gz)")
    a = p.parse_args(argv)
    h = write_dump(a.dump)
    counts = {s: len(load(s, dump=a.dump)) for s in ("train", "val", "test")}
    size = Path(a.dump).stat().st_size
    print(f"wrote {a.dump}: Python {h['python']}, {h['docs']} documents ({counts}), "
          f"{h['chars'] / 1e6:.1f} M chars, {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
