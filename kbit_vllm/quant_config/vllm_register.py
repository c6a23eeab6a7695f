"""Registers "kbit" and "awq_orin" with vLLM; called by the vllm.general_plugins entry point.

vLLM calls the entry point in the frontend, the engine core and every worker, and the config
object is pickled between them, so every process must be able to resolve both names.
"""

from __future__ import annotations

_METHODS = ("kbit", "awq_orin")


def register_vllm() -> None:
    """Idempotent: registers each name once per process; never touches CUDA."""
    from vllm.model_executor.layers.quantization import (
        QUANTIZATION_METHODS,
        get_quantization_config,
        register_quantization_config,
    )

    from .vllm_awq_orin import AwqOrinConfig
    from .vllm_kbit import KbitConfig

    for name, cls in zip(_METHODS, (KbitConfig, AwqOrinConfig), strict=False):
        if name in QUANTIZATION_METHODS:
            try:
                if get_quantization_config(name) is cls:
                    continue
            except ValueError:
                pass
        register_quantization_config(name)(cls)
