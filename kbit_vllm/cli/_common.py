"""Helpers shared by the subcommands: the bundled model, file sizes, formatting."""

from __future__ import annotations

from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def bundled_model() -> Path:
    """The small trained Llama shipped as package data (see its README.md model card)."""
    path = Path(__file__).resolve().parents[1] / "data" / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"the bundled model is missing from {path}; reinstall kbit_vllm")
    return path


def weight_file_bytes(folder: Path) -> int:
    """Bytes of the weight files in an HF folder (config and tokenizer left out)."""
    return sum(f.stat().st_size for f in Path(folder).iterdir() if f.is_file() and f.suffix in WEIGHT_SUFFIXES)


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def repo_root() -> Path | None:
    """The source checkout this package runs from (editable install), or None for a wheel install."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "benchmarks").is_dir() and (root / "pyproject.toml").is_file() else None
