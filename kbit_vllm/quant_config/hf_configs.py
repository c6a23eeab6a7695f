"""Hugging Face quantization configs: KbitConfig ("kbit") and AwqOrinConfig ("awq_orin").

transformers' ``from_dict`` calls ``cls(**config_dict)`` and ``to_dict`` dumps ``__dict__`` into
config.json, so every attribute here is a JSON value, ``__init__`` accepts every saved key, and
it sets ``quant_method`` itself. Also ties_word_embeddings, which both the HF quantizer and the vLLM
config ask of a model config. Importing this module needs transformers.
"""

from __future__ import annotations

import math
from typing import Any

from transformers.utils.quantization_config import QuantizationConfigMixin

from ..formats import AWQ_GROUP_SIZES, BLOCK, SUPPORTED_BITS


def ties_word_embeddings(model_config: Any) -> bool:
    """Whether a transformers model config (its text config, for multimodal ones) shares lm_head
    with the input embeddings: such a head stays float under lm_head=True, in HF and vLLM alike."""
    if model_config is None:
        return False
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    return bool(getattr(text, "tie_word_embeddings", False))


def _check_modules(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: modules_to_not_convert must be a list of module names, got {value!r}")
    return list(value)


class KbitConfig(QuantizationConfigMixin):
    """k-bit codebook blockwise weight quantization (k = 2..5, blocks of 32 inputs).

    Pass it to ``from_pretrained(path, quantization_config=KbitConfig(bits=3))`` to quantize a
    float checkpoint while loading; a checkpoint saved with ``save_pretrained`` reloads as kbit
    (after ``import kbit_vllm``) with no config passed.

    Args:
        bits: bits per weight, 2, 3, 4 or 5.
        blocksize: must be 32 (the kernels' block).
        modules_to_not_convert: module names/patterns kept in full precision (transformers
            semantics: regex matched from the start of the full name, or a name suffix).
            Tied embeddings are always added, and ``lm_head`` unless ``lm_head=True``; the resolved
            list is saved.
        codebook: optional 2^k floats in [-1, 1]; default is the normal-float codebook.
        lm_head: also quantize the output projection (opt-in: it is the largest single matrix of
            most models, ~10% of a Llama-3-8B decode step in bf16, and its error reaches every
            logit). A model whose lm_head is tied to the input embeddings keeps it in float.
    """

    def __init__(self, bits: int = 4, blocksize: int = BLOCK, modules_to_not_convert: list[str] | None = None,
                 codebook: list[float] | None = None, lm_head: bool = False, **kwargs: Any) -> None:
        self.quant_method = "kbit"
        self.bits = bits
        self.blocksize = blocksize
        self.modules_to_not_convert = modules_to_not_convert
        self.codebook = codebook
        self.lm_head = lm_head
        self.post_init()

    def post_init(self) -> None:
        """Validate eagerly so a bad config fails before any weight is read."""
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or self.bits not in SUPPORTED_BITS:
            raise ValueError(f"KbitConfig: bits must be one of {SUPPORTED_BITS}, got {self.bits!r}")
        if isinstance(self.blocksize, bool) or self.blocksize != BLOCK:
            raise ValueError(f"KbitConfig: blocksize must be {BLOCK} (the only block the kernels use), "
                             f"got {self.blocksize!r}")
        self.modules_to_not_convert = _check_modules(self.modules_to_not_convert, "KbitConfig")
        if not isinstance(self.lm_head, bool):
            raise ValueError(f"KbitConfig: lm_head must be true or false, got {self.lm_head!r}")
        if self.codebook is not None:
            cb = [float(v) for v in self.codebook]
            if len(cb) != 1 << self.bits:
                raise ValueError(f"KbitConfig: codebook for bits={self.bits} needs {1 << self.bits} values, "
                                 f"got {len(cb)}")
            if not all(math.isfinite(v) and abs(v) <= 1.0 for v in cb):
                raise ValueError("KbitConfig: codebook values must be finite and within [-1, 1]")
            self.codebook = cb

    def to_dict(self) -> dict[str, Any]:
        """The config.json entry; ``codebook`` and ``lm_head`` only when set."""
        d = {"quant_method": self.quant_method, "bits": self.bits, "blocksize": self.blocksize,
             "modules_to_not_convert": self.modules_to_not_convert}
        if self.codebook is not None:
            d["codebook"] = list(self.codebook)
        if self.lm_head:
            d["lm_head"] = True
        return d

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KbitConfig) and self.to_dict() == other.to_dict()

    __hash__ = None  # mutable


class AwqOrinConfig(QuantizationConfigMixin):
    """Serve a standard AutoAWQ int4 "gemm" checkpoint on kbit_vllm's awq ops (no autoawq/gptqmodel).

    An AWQ checkpoint's config.json says ``"quant_method": "awq"``, which transformers routes
    to its own AWQ quantizer. Two ways to run it on awq_orin instead (``import kbit_vllm`` first):

    1. Pass the config (kbit_vllm teaches transformers to accept this one override)::

           model = AutoModelForCausalLM.from_pretrained(path, quantization_config=AwqOrinConfig())

       bits/group_size/zero_point/version/modules_to_not_convert are then read from the
       checkpoint's config; a non-None ``modules_to_not_convert`` passed here replaces it.
    2. Or rewrite the model config explicitly (no patching involved)::

           config = AwqOrinConfig.model_config(path)      # AutoConfig with quant_method "awq_orin"
           model = AutoModelForCausalLM.from_pretrained(path, config=config)

    Only 4-bit, zero-point, "gemm" checkpoints with group size 32, 64 or 128 are supported.
    MoE experts (transformers 5.x fused experts) load from AutoAWQ per-expert tensors.
    ``save_pretrained`` writes a standard AutoAWQ checkpoint again: the layers' own AWQ tensors
    (per expert for MoE) and ``"quant_method": "awq"`` in config.json (``to_dict``), so any AWQ
    loader reads it; reload it here with ``quantization_config=AwqOrinConfig()`` as before.
    """

    def __init__(self, bits: int = 4, group_size: int = 128, zero_point: bool = True, version: str = "gemm",
                 modules_to_not_convert: list[str] | None = None, **kwargs: Any) -> None:
        self.quant_method = "awq_orin"
        self.bits = kwargs.get("w_bit", bits)
        self.group_size = kwargs.get("q_group_size", group_size)
        self.zero_point = zero_point
        self.version = str(version).lower()
        self.modules_to_not_convert = modules_to_not_convert
        self.post_init()

    def post_init(self) -> None:
        if self.bits != 4:
            raise ValueError(f"AwqOrinConfig: only 4-bit AWQ checkpoints are supported, got bits={self.bits!r}")
        if self.group_size not in AWQ_GROUP_SIZES:
            raise ValueError(f"AwqOrinConfig: group_size must be one of {AWQ_GROUP_SIZES}, got {self.group_size!r}")
        if not self.zero_point:
            raise ValueError("AwqOrinConfig: only zero-point (asymmetric) AWQ checkpoints are supported")
        if self.version != "gemm":
            raise ValueError(f"AwqOrinConfig: only AutoAWQ 'gemm' checkpoints are supported, got version="
                             f"{self.version!r}")
        self.modules_to_not_convert = _check_modules(self.modules_to_not_convert, "AwqOrinConfig")

    @classmethod
    def from_checkpoint_config(cls, awq: dict[str, Any], override: AwqOrinConfig | None = None) -> AwqOrinConfig:
        """An AWQ checkpoint's quantization_config dict -> AwqOrinConfig (override's skip list wins)."""
        d = {k: v for k, v in awq.items() if k != "quant_method"}
        cfg = cls(**d)
        if override is not None and override.modules_to_not_convert is not None:
            cfg.modules_to_not_convert = list(override.modules_to_not_convert)
        return cfg

    @classmethod
    def model_config(cls, path: str, **kwargs: Any) -> Any:
        """AutoConfig of an AWQ checkpoint with its quantization_config switched to awq_orin."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path, **kwargs)
        qc = getattr(config, "quantization_config", None)
        if qc is None:
            raise ValueError(f"AwqOrinConfig: {path} has no quantization_config; awq_orin needs an AWQ checkpoint")
        qc = qc if isinstance(qc, dict) else qc.to_dict()
        if qc.get("quant_method") not in ("awq", "awq_orin"):
            raise ValueError(f"AwqOrinConfig: {path} is quantized with {qc.get('quant_method')!r}, not AWQ")
        config.quantization_config = dict(cls.from_checkpoint_config(qc).to_dict(), quant_method="awq_orin")
        return config

    def to_dict(self) -> dict[str, Any]:
        """The config.json entry: the AutoAWQ checkpoint's own (``quant_method`` "awq")."""
        return {"quant_method": "awq", "bits": self.bits, "group_size": self.group_size,
                "zero_point": self.zero_point, "version": self.version,
                "modules_to_not_convert": self.modules_to_not_convert}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AwqOrinConfig) and self.to_dict() == other.to_dict()

    __hash__ = None
