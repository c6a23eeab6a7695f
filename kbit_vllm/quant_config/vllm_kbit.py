"""vLLM QuantizationConfig "kbit": k-bit codebook weights, online or from a kbit checkpoint.

Parameters come from the checkpoint's config.json `quantization_config` or, for plain fp16 /
bf16 checkpoints, from `hf_overrides={"quantization_config": {"quant_method": "kbit", ...}}`
(CLI `--hf-overrides`); with neither, `quantization="kbit"` uses the defaults (4 bits, the
normal-float codebook). Keys: bits, codebook (optional list of 2^bits floats),
modules_to_not_convert (substrings of module names kept unquantized), lm_head (also quantize the
output projection; off by default, and a head tied to the input embeddings stays float).

A folder whose safetensors hold `<layer>.weight_packed` is loaded as pre-quantized (its lm_head
too when it holds `lm_head.weight_packed`); any other folder is quantized while it loads.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

from ..formats import check_bits, check_codebook, normal_float_codebook
from .hf_configs import ties_word_embeddings
from .vllm_common import ConfigCommon, is_moe_router

PACKED_SUFFIX = ".weight_packed"
ABSMAX_SUFFIX = ".weight_absmax"
CODEBOOK_SUFFIX = ".codebook"
LM_HEAD = "lm_head"

logger = init_logger(__name__)


def resolve_codebook(bits: int, codebook: list[float] | None) -> torch.Tensor:
    """The config's custom codebook as fp32 [2^bits], or the normal-float default."""
    if codebook is None:
        return normal_float_codebook(bits).clone()
    cb = torch.tensor(codebook, dtype=torch.float32)
    check_codebook(cb, bits, "kbit config")
    return cb


def checkpoint_tensor_names(model: str, revision: str | None = None) -> list[str] | None:
    """Tensor names of a checkpoint's safetensors files (headers only), or None if unknown."""
    if os.path.isdir(model):
        files = sorted(glob.glob(os.path.join(model, "*.safetensors")))
        if not files:
            return None
        from safetensors import safe_open

        names: list[str] = []
        for f in files:
            with safe_open(f, framework="pt") as fh:
                names.extend(fh.keys())
        return names
    try:  # hub model id: vLLM reads the headers remotely
        from vllm.transformers_utils.config import get_safetensors_params_metadata

        return list(get_safetensors_params_metadata(model, revision=revision))
    except Exception:  # no metadata just means "decide by the config"
        return None


def is_moe_layer(layer: torch.nn.Module) -> bool:
    """RoutedExperts (0.28+/0.33) or FusedMoE (0.25.1, where FusedMoE is a real class there)."""
    try:
        from vllm.model_executor.layers.fused_moe import RoutedExperts as _Moe
    except ImportError:  # pragma: no cover - older vLLM
        from vllm.model_executor.layers.fused_moe import FusedMoE as _Moe
    return isinstance(_Moe, type) and isinstance(layer, _Moe)


class KbitConfig(ConfigCommon, QuantizationConfig):
    """Config for kbit; picklable (plain Python fields) so it travels to engine core and workers."""

    def __init__(self, bits: int = 4, codebook: list[float] | None = None,
                 modules_to_not_convert: list[str] | None = None, prequantized: bool | None = None,
                 lm_head: bool = False) -> None:
        super().__init__()
        if not isinstance(lm_head, bool):
            raise ValueError(f"kbit config: lm_head must be true or false, got {lm_head!r}")
        check_bits(bits, "kbit config")
        self.bits = bits
        self.codebook = [float(v) for v in codebook] if codebook is not None else None
        if self.codebook is not None:
            resolve_codebook(bits, self.codebook)  # validate early, in the frontend
        self.modules_to_not_convert = list(modules_to_not_convert or [])
        # None: decided by maybe_update_config from the checkpoint's tensor names.
        self.prequantized = prequantized
        self.unquantized_in_checkpoint: list[str] = []
        # Online: as configured, until maybe_update_config sees tied embeddings. Pre-quantized:
        # whether the checkpoint stores lm_head packed, whatever the config says.
        self.lm_head = lm_head

    def __repr__(self) -> str:
        return (f"KbitConfig(bits={self.bits}, codebook={'custom' if self.codebook else 'normal-float'}, "
                f"modules_to_not_convert={self.modules_to_not_convert}, prequantized={self.prequantized}, "
                f"lm_head={self.lm_head})")

    @classmethod
    def get_name(cls) -> str:
        return "kbit"

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # lets quantization="kbit" alone build KbitConfig() with defaults

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> KbitConfig:
        method = str(config.get("quant_method", "kbit")).lower()
        if method != "kbit":
            raise ValueError(f"kbit: quantization_config has quant_method={method!r}, expected 'kbit'")
        bits = cls.get_from_keys_or(config, ["bits", "k"], 4)
        if isinstance(bits, float) and bits.is_integer():
            bits = int(bits)
        return cls(bits=bits,
                   codebook=cls.get_from_keys_or(config, ["codebook"], None),
                   modules_to_not_convert=cls.get_from_keys_or(config, ["modules_to_not_convert"], None),
                   prequantized=cls.get_from_keys_or(config, ["prequantized"], None),
                   lm_head=cls.get_from_keys_or(config, ["lm_head"], False))

    @classmethod
    def from_config_dict_json(cls, s: str) -> KbitConfig:
        return cls.from_config(json.loads(s))

    def maybe_update_config(self, model_name: str, hf_config: Any = None, revision: str | None = None) -> None:
        """Decide online vs pre-quantized from the checkpoint, once, in the frontend."""
        names = checkpoint_tensor_names(model_name, revision)
        if self.prequantized is None:
            self.prequantized = bool(names) and any(n.endswith(PACKED_SUFFIX) for n in names)
        if self.prequantized and names:
            self.note_unquantized_layers(names, PACKED_SUFFIX)
            self.lm_head = any(n.endswith(LM_HEAD + PACKED_SUFFIX) for n in names)
        elif self.lm_head and ties_word_embeddings(hf_config):
            logger.warning("kbit: lm_head=true, but this model ties lm_head to the input embeddings; "
                           "lm_head stays unquantized")
            self.lm_head = False

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        from ..layers.vllm_linear import KbitLinearMethod, KbitOnlineLinearMethod

        if isinstance(layer, ParallelLMHead):  # before LinearBase: vLLM's lm_head is an embedding
            if not self.lm_head or self.is_skipped(prefix):
                return None
            cls = KbitLinearMethod if self.prequantized else KbitOnlineLinearMethod
            return cls(self.bits, self.codebook, prefix, None)
        if isinstance(layer, LinearBase):
            if self.is_skipped(prefix) or (not self.prequantized and is_moe_router(prefix)):
                return UnquantizedLinearMethod()
            cls = KbitLinearMethod if self.prequantized else KbitOnlineLinearMethod
            return cls(self.bits, self.codebook, prefix, getattr(self, "packed_modules_mapping", None))
        if is_moe_layer(layer):
            from ..layers.vllm_moe import KbitMoEMethod, KbitOnlineMoEMethod

            if self.experts_skipped(prefix):
                return None  # vLLM's unquantized MoE method
            cls_moe = KbitMoEMethod if self.prequantized else KbitOnlineMoEMethod
            return cls_moe(layer.moe_config, self.bits, self.codebook, prefix)
        return None  # embeddings, lm_head, attention: unquantized
