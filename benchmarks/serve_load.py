"""`vllm serve --quantization kbit` on CPU under load: N concurrent greedy chat requests.

Starts the OpenAI server on a tiny random Llama (tests/vllm_helpers.py), asks every prompt once
sequentially (the reference answers), then all N at once from the `openai` async client, and
checks that every concurrent answer equals its sequential one and that the server is still up.
Prints one RESULT JSON line (requests, tokens, wall time, throughput). tests/test_vllm_serve_load.py
runs the same code; run it by hand with:
    PYTHONPATH=. python benchmarks/serve_load.py --requests 64 --max-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import vllm_helpers as H  # noqa: E402

from kbit_vllm.cli.server import stop_server  # noqa: E402

# Joins the message contents: the word-level test tokenizer has no chat template of its own.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(n: int) -> list[str]:
    """n distinct prompts of 3..10 test tokens (deterministic)."""
    out = []
    for i in range(n):
        length = 3 + i % 8
        out.append(" ".join(f"t{(7 * i + 13 * j) % 120 + 3}" for j in range(length)))
    return out


def start_server(folder: Path, port: int, log_path: Path, bits: int, dtype: str, max_num_seqs: int) -> subprocess.Popen:
    """The OpenAI API server (the module `vllm serve` runs) in a subprocess; output to log_path."""
    H.set_cpu_env()
    tmpl = log_path.parent / "chat_template.jinja"
    tmpl.write_text(CHAT_TEMPLATE)
    overrides = json.dumps({"quantization_config": {"quant_method": "kbit", "bits": bits}})
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
           "--quantization", "kbit", "--hf-overrides", overrides, "--dtype", dtype,
           "--enforce-eager", "--max-model-len", "128", "--max-num-seqs", str(max_num_seqs),
           "--chat-template", str(tmpl), "--disable-log-stats"]
    log = open(log_path, "w")  # noqa: SIM115 - the child holds it; closed by stop_server_and_log
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    proc._kbit_log = log  # type: ignore[attr-defined]
    return proc


def wait_ready(proc: subprocess.Popen, port: int, log_path: Path, timeout: float = 300) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=30)
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            client.models.list()
            return
        except openai.APIConnectionError:
            if time.time() > deadline:
                raise RuntimeError("server did not come up") from None
            time.sleep(1)


def stop_server_and_log(proc: subprocess.Popen) -> None:
    stop_server(proc)
    proc._kbit_log.close()  # type: ignore[attr-defined]


async def _ask(client: Any, prompt: str, max_tokens: int) -> tuple[str, int]:
    r = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                             max_tokens=max_tokens, temperature=0.0, seed=0)
    return r.choices[0].message.content, r.usage.completion_tokens


async def _sequential(port: int, ps: list[str], max_tokens: int) -> list[tuple[str, int]]:
    import openai

    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=300) as c:
        return [await _ask(c, p, max_tokens) for p in ps]


async def _concurrent(port: int, ps: list[str], max_tokens: int) -> list[tuple[str, int]]:
    import httpx
    import openai

    # One connection per request, so all of them are in flight at once (httpx's default pool is 100).
    limits = httpx.Limits(max_connections=len(ps) + 8, max_keepalive_connections=len(ps) + 8)
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=600,
                                  http_client=openai.DefaultAsyncHttpxClient(limits=limits)) as c:
        return list(await asyncio.gather(*(_ask(c, p, max_tokens) for p in ps)))


def run_load(workdir: Path, n: int = 64, max_tokens: int = 16, bits: int = 4, dtype: str = "bfloat16",
             hidden: int = 128, layers: int = 2) -> dict[str, Any]:
    """Serve, query sequentially then concurrently, compare; returns the measurements.

    Raises AssertionError naming the first request whose concurrent answer differs."""
    cfg, st = H.llama_state(hidden=hidden, inter=2 * hidden, layers=layers)
    folder = H.save_folder(workdir / "m", cfg, st)
    port = free_port()
    log_path = workdir / "server.log"
    t0 = time.time()
    proc = start_server(folder, port, log_path, bits, dtype, max_num_seqs=n)
    try:
        wait_ready(proc, port, log_path)
        startup = time.time() - t0
        ps = prompts(n)
        t1 = time.time()
        seq = asyncio.run(_sequential(port, ps, max_tokens))
        t_seq = time.time() - t1
        t2 = time.time()
        conc = asyncio.run(_concurrent(port, ps, max_tokens))
        t_conc = time.time() - t2
        alive = proc.poll() is None
        diffs = [i for i, (a, b) in enumerate(zip(seq, conc, strict=True)) if a != b]
        assert alive, f"server died under load:\n{log_path.read_text()[-3000:]}"
        assert not diffs, (f"{len(diffs)} of {n} concurrent answers differ from the sequential ones, first: "
                           f"prompt {ps[diffs[0]]!r}: {seq[diffs[0]]} vs {conc[diffs[0]]}")
        assert all(t == max_tokens for _, t in conc) or all(t >= 1 for _, t in conc)
        tokens = sum(t for _, t in conc)
        return {"requests": n, "max_tokens": max_tokens, "bits": bits, "dtype": dtype, "hidden": hidden,
                "layers": layers, "completion_tokens": tokens, "startup_s": round(startup, 1),
                "sequential_s": round(t_seq, 2), "concurrent_s": round(t_conc, 2),
                "sequential_tok_s": round(sum(t for _, t in seq) / t_seq, 1),
                "concurrent_tok_s": round(tokens / t_conc, 1),
                "concurrent_req_s": round(n / t_conc, 2), "all_equal": True, "server_alive": alive}
    finally:
        stop_server_and_log(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        res = run_load(Path(d), a.requests, a.max_tokens, a.bits, a.dtype, a.hidden, a.layers)
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
