"""What the vLLM "kbit" and "awq_orin" configs share: which linear layers stay unquantized, and
the activation dtypes / capability they declare.

Our own matcher instead of vLLM's is_layer_skipped, whose signature changed across the
supported versions (0.25.1 has no match_mode). A fused layer (qkv_proj, gate_up_proj) is
skipped when its checkpoint shards are; shards that disagree are an error, since one fused
weight cannot be half quantized.
"""

from __future__ import annotations

from typing import Any

import torch


def _shard_prefixes(prefix: str, packed_modules_mapping: dict[str, list[str]]) -> list[str]:
    head, _, last = prefix.rpartition(".")
    shards = packed_modules_mapping.get(last)
    if not shards:
        return [prefix]
    return [f"{head}.{s}" if head else s for s in shards]


def layer_skipped(prefix: str, names: list[str], packed_modules_mapping: dict[str, list[str]],
                  exact: bool) -> bool:
    """True if the layer at prefix matches names (exact module names, or substrings)."""
    if not names:
        return False
    hits = [(p in names) if exact else any(n in p for n in names)
            for p in _shard_prefixes(prefix, packed_modules_mapping)]
    if any(hits) and not all(hits):
        raise ValueError(f"layer {prefix}: its fused shards are partly unquantized ({names}); "
                         "a fused layer must be quantized or skipped as a whole")
    return all(hits)


ROUTER_NAMES = ("gate", "router", "shared_expert_gate")


def is_moe_router(prefix: str) -> bool:
    """A MoE router (`...mlp.gate`, `...block_sparse_moe.gate`): tiny, and its top-k choice is
    sensitive, so online quantization keeps it in the model dtype, as AutoAWQ checkpoints and the
    HF path do (HF routers are not nn.Linear). Dense `gate_proj` / `gate_up_proj` do not match.
    Checkpoints decide for themselves (unquantized_in_checkpoint)."""
    return prefix.rpartition(".")[2] in ROUTER_NAMES


class ConfigCommon:
    """Mixin: modules_to_not_convert (substrings) + unquantized_in_checkpoint (exact names)."""

    modules_to_not_convert: list[str]
    unquantized_in_checkpoint: list[str]
    packed_modules_mapping: dict[str, list[str]]

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 75

    def note_unquantized_layers(self, names: list[str], quantized_suffix: str) -> None:
        """Layers stored with a plain `.weight` and no `<layer><quantized_suffix>` stay float."""
        quantized = {n[: -len(quantized_suffix)] for n in names if n.endswith(quantized_suffix)}
        plain = {n[: -len(".weight")] for n in names if n.endswith(".weight")}
        self.unquantized_in_checkpoint = sorted(plain - quantized)

    def apply_vllm_mapper(self, hf_to_vllm_mapper: Any) -> None:
        if self.modules_to_not_convert:
            self.modules_to_not_convert = hf_to_vllm_mapper.apply_list(self.modules_to_not_convert)
        if self.unquantized_in_checkpoint:
            self.unquantized_in_checkpoint = hf_to_vllm_mapper.apply_list(self.unquantized_in_checkpoint)

    def experts_skipped(self, prefix: str) -> bool:
        """A MoE layer (prefix `...experts`) stays unquantized when modules_to_not_convert names it
        or the checkpoint stores its experts (`<prefix>.<e>.<proj>.weight`) as plain tensors."""
        if any(n in prefix for n in self.modules_to_not_convert or []):
            return True
        return any(n.startswith(prefix + ".") for n in self.unquantized_in_checkpoint or [])

    def is_skipped(self, prefix: str) -> bool:
        mapping = getattr(self, "packed_modules_mapping", None) or {}
        return (layer_skipped(prefix, self.modules_to_not_convert or [], mapping, exact=False)
                or layer_skipped(prefix, self.unquantized_in_checkpoint or [], mapping, exact=True))
