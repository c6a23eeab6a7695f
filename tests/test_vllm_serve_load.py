"""`vllm serve --quantization kbit` on CPU under load (issue #9): 64 concurrent greedy chat requests
from the openai client all complete, each equal to its sequential answer, and the server stays up.

Runs benchmarks/serve_load.py (which also prints the throughput recorded in benchmarks/RESULTS.md);
~35 s on 2 cores. In float32: a batch of 64 and a batch of one then round alike, so the answers
must match token for token; in bf16 vLLM's CPU kernels round differently per batch size on some
hosts (AVX-512 without AVX512-BF16: 2 of 64 answers flipped at near-ties), which says nothing
about requests leaking into each other.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("openai")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import serve_load  # noqa: E402


def test_64_concurrent_chat_requests_equal_sequential(tmp_path: Path) -> None:
    res = serve_load.run_load(tmp_path, n=64, max_tokens=16, bits=4, dtype="float32")
    print(res)
    assert res["all_equal"] and res["server_alive"]
    assert res["completion_tokens"] >= 64
