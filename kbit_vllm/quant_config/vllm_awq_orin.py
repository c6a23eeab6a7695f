"""vLLM QuantizationConfig "awq_orin": standard AutoAWQ GEMM int4 checkpoints on our kernels.

The checkpoint says quant_method "awq"; it is served by awq_orin only when the user asks for
it (`quantization="awq_orin"`), so installing the plugin never changes how plain "awq" runs.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase

from ..formats import AWQ_GROUP_SIZES
from .vllm_common import ConfigCommon
from .vllm_kbit import checkpoint_tensor_names, is_moe_layer


class AwqOrinConfig(ConfigCommon, QuantizationConfig):
    """AutoAWQ GEMM layout: 4 bits, zero points, group size 32 / 64 / 128."""

    def __init__(self, group_size: int = 128, modules_to_not_convert: list[str] | None = None,
                 bits: int = 4, zero_point: bool = True, version: str = "gemm") -> None:
        super().__init__()
        if bits != 4:
            raise ValueError(f"awq_orin: only 4-bit AWQ checkpoints are supported, got bits={bits}")
        if not zero_point:
            raise ValueError("awq_orin: only AWQ checkpoints with zero points (zero_point=true) are supported")
        if group_size not in AWQ_GROUP_SIZES:
            raise ValueError(f"awq_orin: group_size must be one of {AWQ_GROUP_SIZES}, got {group_size}")
        if str(version).lower() != "gemm":
            raise ValueError(f"awq_orin: only the AutoAWQ 'gemm' packing is supported, got version={version!r}")
        self.group_size = group_size
        self.modules_to_not_convert = list(modules_to_not_convert or [])
        self.unquantized_in_checkpoint: list[str] = []

    def __repr__(self) -> str:
        return f"AwqOrinConfig(group_size={self.group_size}, modules_to_not_convert={self.modules_to_not_convert})"

    @classmethod
    def get_name(cls) -> str:
        return "awq_orin"

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["quant_config.json", "quantize_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AwqOrinConfig:
        return cls(group_size=cls.get_from_keys_or(config, ["q_group_size", "group_size"], 128),
                   modules_to_not_convert=cls.get_from_keys_or(config, ["modules_to_not_convert"], None),
                   bits=cls.get_from_keys_or(config, ["w_bit", "bits"], 4),
                   zero_point=cls.get_from_keys_or(config, ["zero_point"], True),
                   version=cls.get_from_keys_or(config, ["version"], "gemm"))

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg: dict[str, Any], user_quant: str | None,
                                     hf_config: Any = None) -> str | None:
        """Claim an "awq" checkpoint only when the user explicitly chose awq_orin."""
        if str(hf_quant_cfg.get("quant_method", "")).lower() == "awq" and user_quant == "awq_orin":
            return "awq_orin"
        return None

    def maybe_update_config(self, model_name: str, hf_config: Any = None, revision: str | None = None) -> None:
        """Layers stored with a plain `.weight` (no `.qweight`) stay unquantized, as in AutoAWQ."""
        names = checkpoint_tensor_names(model_name, revision)
        if names:
            self.note_unquantized_layers(names, ".qweight")

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        from ..layers.vllm_linear import AwqOrinLinearMethod

        if isinstance(layer, LinearBase):
            if self.is_skipped(prefix):
                return UnquantizedLinearMethod()
            return AwqOrinLinearMethod(self.group_size, prefix, getattr(self, "packed_modules_mapping", None))
        if is_moe_layer(layer):
            from ..layers.vllm_moe import AwqOrinMoEMethod

            if self.experts_skipped(prefix):
                return None  # vLLM's unquantized MoE method
            return AwqOrinMoEMethod(layer.moe_config, self.group_size, prefix)
        return None
