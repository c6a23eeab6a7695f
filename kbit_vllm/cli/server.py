"""Stopping a `vllm serve` child process: shared by the demo, the load benchmark and the tests."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_server(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM the server, its whole process group when it leads one (vLLM's engine core and
    workers are children), then SIGKILL after `timeout` seconds; a server already gone is fine."""
    if proc.poll() is not None:
        return

    def send(sig: int) -> None:
        try:
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass

    send(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()
