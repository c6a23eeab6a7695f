"""Install kbit_vllm; when nvcc is present, also build the CUDA library from kbit_vllm/csrc.

Without nvcc (or with KBIT_SKIP_CUDA_BUILD=1) the package installs pure-Python and the
PyTorch path serves every op.
"""

import importlib.util
import os
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _build_module():
    spec = importlib.util.spec_from_file_location("kbit_build", ROOT / "kbit_vllm" / "csrc" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithCuda(build_py):
    """Build libkbit_vllm.so in the source tree (so editable installs find it), then copy it."""

    def run(self):
        super().run()
        if os.environ.get("KBIT_SKIP_CUDA_BUILD") == "1":
            print("kbit_vllm: KBIT_SKIP_CUDA_BUILD=1, skipping the CUDA library")
            return
        b = _build_module()
        if b.find_nvcc() is None:
            print("kbit_vllm: nvcc not found; installing without the CUDA library (CPU path only)")
            return
        lib = b.build()
        if not getattr(self, "editable_mode", False):
            dest = Path(self.build_lib) / "kbit_vllm" / "lib"
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, dest / lib.name)


setup(
    packages=find_packages(include=["kbit_vllm", "kbit_vllm.*"]),
    package_data={"kbit_vllm": ["csrc/*.cu", "csrc/*.cuh", "csrc/*.cpp", "lib/*.so", "data/model/*"]},
    cmdclass={"build_py": BuildPyWithCuda},
)
