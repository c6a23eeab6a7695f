"""Find and load the compiled CUDA library (libkbit_vllm.so) with ctypes.

The library has a plain C API and no libtorch dependency, so one build serves every torch.
Loading never raises: the outcome, including why it failed, is kept in LibraryStatus.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from pathlib import Path

LIB_NAME = "libkbit_vllm.so"


@dataclass(frozen=True)
class LibraryStatus:
    """Whether the CUDA library loaded, from where, for which archs, and if not, why."""

    loaded: bool
    path: str | None = None
    archs: tuple[str, ...] = field(default_factory=tuple)
    reason: str = ""

    def __str__(self) -> str:
        if self.loaded:
            return f"CUDA library loaded from {self.path} (archs: {', '.join(self.archs) or '?'})"
        return f"CUDA library not loaded: {self.reason}"


def _candidates() -> list[Path]:
    env = os.environ.get("KBIT_VLLM_LIBRARY")
    pkg = Path(__file__).resolve().parents[2]
    out = [Path(env)] if env else []
    return out + [pkg / "lib" / LIB_NAME]


def _load() -> tuple[ctypes.CDLL | None, LibraryStatus]:
    tried = []
    for path in _candidates():
        if not path.is_file():
            tried.append(f"{path} (missing)")
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            return None, LibraryStatus(False, str(path), reason=f"{path} failed to load: {e}")
        lib.kbit_vllm_archs.restype = ctypes.c_char_p
        lib.kbit_vllm_error_string.restype = ctypes.c_char_p
        lib.kbit_vllm_error_string.argtypes = [ctypes.c_int]
        archs = tuple(a for a in lib.kbit_vllm_archs().decode().split(",") if a)
        return lib, LibraryStatus(True, str(path), archs)
    hint = "build it with nvcc present (pip install -e .) or set KBIT_VLLM_LIBRARY"
    return None, LibraryStatus(False, None, reason=f"not found at {', '.join(tried)}; {hint}")


LIB, STATUS = _load()
_SM_COUNT: dict[int, int] = {}


def check(code: int, what: str) -> None:
    """Turn a non-zero status from the C API into a RuntimeError naming the call."""
    if code != 0:
        msg = LIB.kbit_vllm_error_string(code).decode() if LIB is not None else str(code)
        raise RuntimeError(f"kbit_vllm CUDA {what} failed: {msg}")


def device_supported(device_index: int) -> tuple[bool, str]:
    """Whether the loaded library holds code for this GPU's compute capability."""
    if LIB is None:
        return False, STATUS.reason
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    cc = major * 10 + minor
    archs = {int("".join(ch for ch in a if ch.isdigit())) for a in STATUS.archs}
    # SASS for sm_XY runs on devices of the same major with minor >= Y (sm_90a only on 9.0).
    ok = any(a // 10 == major and a % 10 <= minor for a in archs)
    return ok, "" if ok else f"library built for {', '.join(STATUS.archs)}, GPU is sm_{cc}"


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (cached: kernel configs read it on every call)."""
    import torch

    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]
