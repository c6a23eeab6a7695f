"""Find and load the compiled CUDA library (libkbit_vllm.so) with ctypes.

The library has a plain C API and no libtorch dependency, so one build serves every torch.
Loading never raises: the outcome, including why it failed, is kept in LibraryStatus. When a
CUDA op runs on a GPU the library cannot serve (missing, unloadable, built for other archs),
kernels_usable() warns once and the op takes the PyTorch path, or raises in strict mode
(KBIT_VLLM_STRICT=1), for deployments where a silent slow path is worse than failing.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from . import dispatch

LIB_NAME = "libkbit_vllm.so"
LIBRARY_ENV = "KBIT_VLLM_LIBRARY"
STRICT_ENV = "KBIT_VLLM_STRICT"


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
    """KBIT_VLLM_LIBRARY alone when set (an explicit choice must not silently load another
    build), else the package's lib/ folder."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return [Path(env)]
    return [Path(__file__).resolve().parents[2] / "lib" / LIB_NAME]


def _load() -> tuple[ctypes.CDLL | None, LibraryStatus]:
    tried = []
    for path in _candidates():
        if not path.is_file():
            tried.append(f"{path} (missing)")
            continue
        try:
            lib = ctypes.CDLL(str(path))
            lib.kbit_vllm_archs.restype = ctypes.c_char_p
            lib.kbit_vllm_error_string.restype = ctypes.c_char_p
            lib.kbit_vllm_error_string.argtypes = [ctypes.c_int]
            archs = tuple(a for a in lib.kbit_vllm_archs().decode().split(",") if a)
            lib.kbit_vllm_set_pdl(ctypes.c_int(int(dispatch.pdl())))
        except OSError as e:
            return None, LibraryStatus(False, str(path), reason=f"{path} failed to load: {e}")
        except AttributeError as e:  # some other shared object, or a build from another version
            return None, LibraryStatus(False, str(path), reason=f"{path} is not a kbit_vllm library: {e}")
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


def arch_supported(archs: tuple[str, ...], capability: tuple[int, int]) -> bool:
    """Whether SASS built for archs ("sm_80", "sm_90a", ...) runs on a GPU of this capability.

    SASS for sm_XY runs on devices of the same major with minor >= Y (sm_90a only on 9.0)."""
    major, minor = capability
    nums = set()
    for a in archs:
        digits = "".join(ch for ch in a if ch.isdigit())
        if digits:
            nums.add(int(digits))
    return any(a // 10 == major and a % 10 <= minor for a in nums)


def capability_supported(capability: tuple[int, int]) -> tuple[bool, str]:
    """(ok, why not) for a GPU of this compute capability and the library as loaded."""
    if LIB is None:
        return False, STATUS.reason
    ok = arch_supported(STATUS.archs, capability)
    cc = f"sm_{capability[0]}{capability[1]}"
    return ok, "" if ok else f"library {STATUS.path} built for {', '.join(STATUS.archs) or 'no archs'}, GPU is {cc}"


def device_supported(device_index: int) -> tuple[bool, str]:
    """Whether the loaded library holds code for this GPU's compute capability."""
    if LIB is None:
        return False, STATUS.reason
    import torch

    return capability_supported(torch.cuda.get_device_capability(device_index))


def strict() -> bool:
    """KBIT_VLLM_STRICT=1: a CUDA op that cannot use the kernels raises instead of falling back."""
    return os.environ.get(STRICT_ENV, "0") not in ("", "0", "false", "False")


_USABLE: dict[str, bool] = {}
_WARNED: set[str] = set()


def resolve(device: str, capability: tuple[int, int]) -> bool:
    """Whether CUDA ops on `device` (of this capability) run the kernels.

    If not: in strict mode a RuntimeError; otherwise one RuntimeWarning per reason, then the
    PyTorch path. The answer is cached per device."""
    if device in _USABLE:
        return _USABLE[device]
    ok, why = capability_supported(capability)
    if not ok:
        msg = f"kbit_vllm: CUDA kernels unavailable on {device} ({why})"
        if strict():
            raise RuntimeError(f"{msg}; {STRICT_ENV}=1 forbids the PyTorch fallback. Build the library for "
                               "this GPU (KBIT_CUDA_ARCHS, pip install -e .) or point KBIT_VLLM_LIBRARY at one.")
        if why not in _WARNED:
            _WARNED.add(why)
            msg += f"; running the slower PyTorch path. Set {STRICT_ENV}=1 to make this an error."
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
    _USABLE[device] = ok
    return ok


def kernels_usable(device_index: int | None) -> bool:
    """resolve() for a CUDA device index (None: the current device)."""
    import torch

    idx = torch.cuda.current_device() if device_index is None else device_index
    key = f"cuda:{idx}"
    if key in _USABLE:
        return _USABLE[key]
    return resolve(key, torch.cuda.get_device_capability(idx))


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (cached: kernel configs read it on every call)."""
    import torch

    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]
