"""kbit_vllm: kbit (2/3/4/5-bit codebook) and awq_orin (AWQ int4) weight-only quantization.

Importing the package defines the kbit_vllm:: torch ops and registers their CPU and CUDA
implementations.
"""

from __future__ import annotations

from . import ops
from .backends import register as _register_backends
from .backends.cuda.library import STATUS as _LIB_STATUS
from .backends.cuda.library import LibraryStatus
from .formats import normal_float_codebook

__version__ = "0.1.0"

_register_backends()

try:  # Hugging Face integration: importing kbit_vllm registers "kbit" and "awq_orin" with transformers
    from .quant_config.hf_configs import AwqOrinConfig, KbitConfig
    from .quant_config.hf_quantizers import register_hf as _register_hf  # noqa: F401  (registers on import)
except ImportError as _hf_err:  # transformers is optional
    _HF_IMPORT_ERROR: ImportError | None = _hf_err

    def __getattr__(name: str):
        if name in ("KbitConfig", "AwqOrinConfig"):
            raise ImportError(f"kbit_vllm.{name} needs transformers>=5: {_HF_IMPORT_ERROR}")
        raise AttributeError(f"module 'kbit_vllm' has no attribute {name!r}")


def cuda_library_status() -> LibraryStatus:
    """Whether the compiled CUDA library loaded, for which archs, and if not, why."""
    return _LIB_STATUS


def register() -> None:
    """vLLM general-plugin entry point: registers the "kbit" and "awq_orin" quantization methods.

    Idempotent; vLLM calls it in the frontend, the engine core and every worker.
    """
    from .quant_config.vllm_register import register_vllm

    register_vllm()


__all__ = [
    "AwqOrinConfig", "KbitConfig", "LibraryStatus", "register", "__version__",
    "cuda_library_status", "normal_float_codebook", "ops",
]
