"""`kbit-vllm demo`: quantize the bundled model, serve it with vLLM through the plugin, ask it something.

The whole path a user would take, on whatever this machine has: `kbit-vllm quantize` into a
cache folder, `vllm serve FOLDER --quantization kbit` as a subprocess (the plugin loads through
vLLM's entry point, nothing imported by hand), the `openai` client against it, then the answer,
decode speed and the weight memory kbit saved. The server is always shut down, also on errors
and Ctrl-C.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ._common import bundled_model, mib, weight_file_bytes
from .quantize import QuantizeReport, quantize_folder
from .server import stop_server

DEFAULT_PROMPT = 'The "with" statement'
SERVED_NAME = "kbit-demo"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="quantize the bundled model, serve it with vLLM, ask it something",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bits", type=int, default=4, choices=(2, 3, 4, 5), help="kbit bits per weight (default 4)")
    p.add_argument("--model", default=None, help="HF float model folder (default: the bundled model)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="completion prompt (the model writes Python docs)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--cache-dir", default=None,
                   help="where quantized checkpoints and the server log go (default ~/.cache/kbit_vllm/demo)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: the GPU when there is one")
    p.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    p.add_argument("--timeout", type=float, default=900, help="seconds to wait for the server (default 900)")
    p.add_argument("--vllm-args", default="", help="extra `vllm serve` arguments, one shell-quoted string")
    return p


def _cache_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kbit_vllm" / "demo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quantized(model: Path, bits: int, cache: Path) -> tuple[Path, QuantizeReport]:
    """The kbit checkpoint of `model` in the cache, made once per (model, bits, model file mtime)."""
    st = (model / "config.json").stat()
    digest = hashlib.sha1(f"{model.resolve()}:{int(st.st_mtime)}".encode()).hexdigest()[:10]
    key = f"{model.name}-{digest}-kbit{bits}"
    out = cache / key
    report = QuantizeReport.load(out)
    if report is not None and report.bits == bits and (out / "config.json").is_file():
        print(f"[1/4] using the kbit k={bits} checkpoint cached in {out}")
        return out, report
    print(f"[1/4] quantizing {model} to kbit k={bits} -> {out}")
    report = quantize_folder(model, out, bits)
    sq = [e.sqnr_db for e in report.layers if e.sqnr_db is not None]
    if sq:
        print(f"      {len(report.layers)} layers in {report.seconds:.1f} s, "
              f"weight SQNR {min(sq):.1f}..{max(sq):.1f} dB")
    return out, report


def _server_env(device: str) -> dict[str, str]:
    env = dict(os.environ)
    if device == "cpu":
        # Small engine for a laptop / CI box: 1 GiB of KV cache, engine core in the server process.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _server_cmd(folder: Path, port: int, device: str, extra: str) -> list[str]:
    # `python -m` rather than the `vllm` script: vllm-cpu does not always install the script.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
           "--quantization", "kbit", "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "4"]
    if device == "cpu":
        cmd.append("--enforce-eager")  # torch.compile would add minutes on a small CPU
    else:
        cmd += ["--gpu-memory-utilization", "0.3"]
    return cmd + shlex.split(extra)


def _wait_healthy(proc: subprocess.Popen, port: int, timeout: float, log: Path) -> None:
    """Poll /health until 200; raise with the log's tail if the server exits or takes too long."""
    deadline = time.time() + timeout
    url = f"http://127.0.0.1:{port}/health"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with code {proc.returncode} while starting; log tail:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.time() > deadline:
            raise RuntimeError(f"vLLM did not become healthy within {timeout:.0f} s; log tail:\n{_tail(log)}")
        time.sleep(1)


def _tail(log: Path, n: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    import torch

    try:
        import openai
    except ImportError:
        print("error: the demo needs the openai client (pip install openai; vLLM installs it)", file=sys.stderr)
        return 2
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model = Path(args.model) if args.model else bundled_model()
    cache = _cache_dir(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    folder, report = _quantized(model, args.bits, cache)

    port = args.port or _free_port()
    log_path = cache / "vllm_server.log"
    cmd = _server_cmd(folder, port, device, args.vllm_args)
    print(f"[2/4] starting vLLM on {device} (port {port}; log {log_path}):\n      {shlex.join(cmd)}", flush=True)
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    proc = None
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_server_env(device),
                                    start_new_session=True)
            t0 = time.time()
            _wait_healthy(proc, port, args.timeout, log_path)
            print(f"      healthy after {time.time() - t0:.0f} s", flush=True)

            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=300)
            print(f"[3/4] asking {SERVED_NAME} (openai client, greedy, {args.max_tokens} tokens): {args.prompt!r}",
                  flush=True)
            sampling = {"temperature": 0.0, "extra_body": {"repetition_penalty": 1.2}}
            client.completions.create(model=SERVED_NAME, prompt=args.prompt, max_tokens=4, **sampling)  # warm-up
            t1 = time.time()
            resp = client.completions.create(model=SERVED_NAME, prompt=args.prompt, max_tokens=args.max_tokens,
                                             **sampling)
            dt = time.time() - t1
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the server (up to 30 s)", file=sys.stderr)
        return 130
    except (RuntimeError, openai.OpenAIError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if proc is not None:
            stop_server(proc)
        signal.signal(signal.SIGTERM, old_term)

    n = resp.usage.completion_tokens
    print("[4/4] answer:\n")
    print(args.prompt + resp.choices[0].text)
    print(f"\n{n} tokens in {dt:.2f} s: {n / dt:.1f} tokens/s (one request, {device}, vLLM + kbit k={args.bits})")
    print(f"weights of the quantized layers: {mib(report.linear_bytes_float)} bf16 -> "
          f"{mib(report.linear_bytes_kbit)} kbit ({report.linear_bytes_float / report.linear_bytes_kbit:.2f}x "
          f"smaller, {mib(report.linear_bytes_float - report.linear_bytes_kbit)} saved)")
    print(f"whole checkpoint: {mib(weight_file_bytes(model))} -> {mib(weight_file_bytes(folder))} "
          f"(embeddings, tied lm_head and norms stay bf16)")
    print(f"done in {time.time() - t_start:.0f} s")
    summary = {"bits": args.bits, "device": device, "tokens": n, "seconds": dt, "text": resp.choices[0].text,
               "linear_bytes_bf16": report.linear_bytes_float, "linear_bytes_kbit": report.linear_bytes_kbit}
    (cache / "last_demo.json").write_text(json.dumps(summary, indent=1))
    return 0
