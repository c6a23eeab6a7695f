"""A GPU whose CUDA library is missing, unloadable or built for other archs: one warning and the
PyTorch path, or an error under KBIT_VLLM_STRICT=1.

The library is loaded at import, so each case imports kbit_vllm in a fresh interpreter with
KBIT_VLLM_LIBRARY pointing at a missing file, a shared object that is not ours, or a stand-in
library (compiled here with the C compiler) that reports archs sm_50 only. The GPU is simulated
only by its compute capability, passed to library.resolve(), the function every CUDA op consults.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kbit_vllm.backends.cuda.library import arch_supported

ROOT = Path(__file__).resolve().parents[1]

# Runs in the child: resolve() for an sm_90 and an sm_52 GPU, twice each plus a second sm_90
# device, recording warnings; then a CPU op, which strict mode must not affect.
_CHILD = r"""
import json, warnings
warnings.simplefilter("always")
out = {}
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    import torch, kbit_vllm
    from kbit_vllm import ops, normal_float_codebook
    from kbit_vllm.backends.cuda import library as L
    out["loaded"] = L.STATUS.loaded
    out["status"] = str(kbit_vllm.cuda_library_status())
    res = {}
    for dev, cap in (("cuda:0", (9, 0)), ("cuda:0", (9, 0)), ("cuda:1", (9, 0)), ("cuda:2", (5, 2))):
        try:
            res[dev] = L.resolve(dev, cap)
        except RuntimeError as e:
            res[dev] = "error: " + str(e)
    out["resolve"] = res
    cb = normal_float_codebook(4)
    p, a = ops.kbit_quantize(torch.randn(8, 64), cb, 4)
    pt, at = ops.kbit_repack(p, a, 4)
    out["cpu_op_shape"] = list(ops.kbit_linear(torch.randn(2, 64), pt, at, cb, None, 4, 8).shape)
    out["warnings"] = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
print("RESULT " + json.dumps(out))
"""


def _run(library: str, strict: bool) -> dict:
    env = dict(os.environ, KBIT_VLLM_LIBRARY=library, KBIT_VLLM_STRICT="1" if strict else "0",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


_FAKE_SRC = r"""
const char* kbit_vllm_archs(void) { return "sm_50"; }
const char* kbit_vllm_error_string(int code) { (void)code; return "fake"; }
int kbit_vllm_set_pdl(int on) { (void)on; return 1; }
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Shared objects: a kbit_vllm stand-in built for sm_50 only, and one without our symbols."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in libraries")
    d = tmp_path_factory.mktemp("libs")
    out = {}
    for name, src in (("sm50", _FAKE_SRC), ("foreign", "int unrelated(void) { return 1; }\n")):
        (d / f"{name}.c").write_text(src)
        so = d / f"lib{name}.so"
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(d / f"{name}.c")], check=True)
        out[name] = str(so)
    return out


def test_arch_table() -> None:
    assert arch_supported(("sm_80", "sm_90a"), (9, 0))
    assert arch_supported(("sm_80",), (8, 6)) and arch_supported(("sm_80",), (8, 9))
    assert not arch_supported(("sm_86",), (8, 0))
    assert not arch_supported(("sm_80", "sm_86"), (9, 0))  # no PTX: newer majors need their own SASS
    assert not arch_supported((), (9, 0))


def test_missing_library_warns_once_and_falls_back(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere" / "libkbit_vllm.so")
    r = _run(missing, strict=False)
    assert not r["loaded"] and missing in r["status"] and "missing" in r["status"]
    assert r["resolve"] == {"cuda:0": False, "cuda:1": False, "cuda:2": False}
    assert len(r["warnings"]) == 1, r["warnings"]  # one warning for one cause, however many devices
    msg = r["warnings"][0]
    assert "CUDA kernels unavailable on cuda:0" in msg and missing in msg and "PyTorch path" in msg
    assert "KBIT_VLLM_STRICT=1" in msg
    assert r["cpu_op_shape"] == [2, 8]


def test_missing_library_strict_raises(tmp_path: Path) -> None:
    r = _run(str(tmp_path / "libkbit_vllm.so"), strict=True)
    for dev in ("cuda:0", "cuda:1", "cuda:2"):
        assert str(r["resolve"][dev]).startswith("error: kbit_vllm: CUDA kernels unavailable on"), r["resolve"]
        assert "KBIT_VLLM_STRICT=1 forbids the PyTorch fallback" in r["resolve"][dev]
    assert r["warnings"] == []
    assert r["cpu_op_shape"] == [2, 8]  # strict mode concerns CUDA only


def test_wrong_arch_library(libs: dict[str, str]) -> None:
    r = _run(libs["sm50"], strict=False)
    assert r["loaded"] and "sm_50" in r["status"]
    assert r["resolve"] == {"cuda:0": False, "cuda:1": False, "cuda:2": True}
    assert len(r["warnings"]) == 1 and "built for sm_50, GPU is sm_90" in r["warnings"][0], r["warnings"]
    s = _run(libs["sm50"], strict=True)
    assert "built for sm_50, GPU is sm_90" in s["resolve"]["cuda:0"] and s["resolve"]["cuda:2"] is True


def test_foreign_shared_object_is_not_loaded(libs: dict[str, str]) -> None:
    r = _run(libs["foreign"], strict=False)
    assert not r["loaded"] and "is not a kbit_vllm library" in r["status"]
    assert r["resolve"]["cuda:0"] is False and len(r["warnings"]) == 1
