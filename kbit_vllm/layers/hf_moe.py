"""Hugging Face replacement for transformers 5.x fused MoE experts: KbitExperts (and the
FusedExperts base that hf_awq_moe.AwqOrinExperts shares).

transformers 5.x keeps a MoE layer's experts as one module with 3-D parameters
``gate_up_proj [E, 2I, H]`` (gate rows, then up rows) and ``down_proj [E, H, I]`` (Mixtral,
Qwen2/3-MoE, OLMoE, ...), called as ``experts(hidden [T, H], top_k_index [T, K],
top_k_weights [T, K])``. KbitExperts keeps that call and runs layers/moe_compute.moe_forward
on ``kbit_vllm::kbit_grouped_linear`` (the module owns its forward; transformers' experts
implementations, which read dense 3-D weights, are not used).

Tensors (the module's state dict; also the load placeholders):
  ``gate_up_proj_packed`` int32 [E, 2I, H/32*k], ``gate_up_proj_absmax`` uint8 [E, 2I, H/32],
  ``down_proj_packed`` int32 [E, H, I/32*k], ``down_proj_absmax`` uint8 [E, H, I/32];
  with ``quantize_on_load`` also float ``gate_up_proj`` / ``down_proj`` placeholders that receive
  the checkpoint weights for the quantize op (dropped by ``repack_``). The codebook is the
  config's (a non-persistent buffer filled by ``repack_``), so experts save no codebook.

On disk. ``save_pretrained`` reverses the model's checkpoint conversion (transformers merges
per-expert ``experts.<e>.w1.weight`` + ``w3.weight`` into ``gate_up_proj`` while loading, and
splits it back while saving). The kbit quantizer adds the same conversion for the ``_packed``
and ``_absmax`` companions, so a saved folder holds per-expert 2-D tensors named like the dense
kbit layers, e.g. for Mixtral
  ``model.layers.<l>.block_sparse_moe.experts.<e>.w1.weight_packed`` [I, H/32*k] (w3 likewise),
  ``...experts.<e>.w2.weight_packed`` [H, I/32*k], and ``...weight_absmax`` beside each,
and for Qwen3-MoE ``model.layers.<l>.mlp.experts.<e>.{gate,up,down}_proj.weight_{packed,absmax}``.
vLLM's expert loader maps ``experts.<e>.<w1|w3|gate_proj|up_proj>.`` to ``experts.w13_`` and
``<w2|down_proj>`` to ``experts.w2_``, i.e. onto KbitMoEMethod's ``w13_weight_packed`` etc.; a
model without such a conversion saves the stacked 3-D tensors under the module's own names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..formats import BLOCK, SUPPORTED_BITS
from .moe_compute import (
    ExpertsOp,
    GroupedLinear,
    check_expert_dims,
    kbit_experts_op,
    kbit_grouped,
    kbit_quantize_experts,
    kbit_repack_experts,
    kbit_unrepack_experts,
    moe_forward,
)

EXPERT_PROJS = ("gate_up_proj", "down_proj")
KBIT_EXPERT_SUFFIXES = ("_packed", "_absmax")


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def fused_experts_shape(module: nn.Module) -> tuple[int, int, int] | None:
    """(experts, hidden, intermediate) when module is a fused experts module KbitExperts can replace.

    The standard layout only: concatenated [gate; up] rows, not transposed, gated, no biases,
    no post-expert norm, and the default gate (act(gate) * up).
    """
    gu, dn = module._parameters.get("gate_up_proj"), module._parameters.get("down_proj")
    if gu is None or dn is None or gu.dim() != 3 or dn.dim() != 3:
        return None
    if (getattr(module, "is_transposed", False) or not getattr(module, "has_gate", True)
            or getattr(module, "has_bias", False) or not getattr(module, "is_concatenated", True)
            or getattr(module, "has_post_expert_norm", False) or not callable(getattr(module, "act_fn", None))):
        return None
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and getattr(gate, "__name__", "") != "_default_apply_gate":
        return None
    n_exp, two_i, hidden = gu.shape
    if two_i % 2 or tuple(dn.shape) != (n_exp, hidden, two_i // 2):
        return None
    return n_exp, hidden, two_i // 2


def has_fused_experts(module: nn.Module) -> bool:
    """Any 3-D parameter of its own: transformers 5.x fused experts, supported or not."""
    return any(p.dim() == 3 for p in module.parameters(recurse=False))


class FusedExperts(nn.Module):
    """What KbitExperts and AwqOrinExperts share: the dims, transformers 5.x's experts call
    ``(hidden [T, H], top_k_index [T, K], top_k_weights [T, K]) -> [T, H]`` on
    moe_compute.moe_forward, and saving the serialized format while resident.

    Subclasses hold their tensors and supply ``_grouped(proj)`` (a GroupedLinear over the resident
    layout) and ``_serialized_state(proj)`` (the serialized tensors that the resident layout
    replaced, by suffix, for the state dict).
    """

    METHOD = ""

    def __init__(self, num_experts: int, hidden_dim: int, intermediate_dim: int,
                 act_fn: Callable[[torch.Tensor], torch.Tensor], block: int, layer_name: str = "") -> None:
        super().__init__()
        check_expert_dims(layer_name or "<unnamed>", self.METHOD, hidden_dim, intermediate_dim, block,
                          "intermediate size")
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden_dim, intermediate_dim
        self.act_fn = act_fn
        self.layer_name = layer_name
        self.resident = False

    def _shapes(self) -> dict[str, tuple[int, int]]:
        """(out, in) of one expert's matrix per projection."""
        return {"gate_up_proj": (2 * self.intermediate_dim, self.hidden_dim),
                "down_proj": (self.hidden_dim, self.intermediate_dim)}

    def _grouped(self, proj: str) -> GroupedLinear:
        raise NotImplementedError

    def _experts_op(self) -> ExpertsOp | None:
        """All of moe_forward as one op, where the format has it (kbit)."""
        return None

    def _serialized_state(self, proj: str) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        if not self.resident:
            raise RuntimeError(f"{type(self).__name__} '{self.layer_name}': weights not repacked yet (call repack_())")
        # Expert ids outside [0, E) (transformers' expert-parallel sentinels) get weight 0 (moe_route).
        return moe_forward(hidden_states, top_k_weights, top_k_index, self.num_experts, self._grouped("gate_up_proj"),
                           self._grouped("down_proj"), self.act_fn, experts_op=self._experts_op())

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        """Always save the serialized (portable, TP-shardable) format, never the resident one."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.resident:
            for proj in EXPERT_PROJS:
                for suffix, t in self._serialized_state(proj).items():
                    destination[prefix + proj + suffix] = t

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}, resident={self.resident}")


class KbitExperts(FusedExperts):
    """A MoE layer's experts as k-bit codebook weights (see the module docstring for tensors)."""

    METHOD = "kbit"

    def __init__(self, num_experts: int, hidden_dim: int, intermediate_dim: int, bits: int,
                 act_fn: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype = torch.bfloat16,
                 quantize_on_load: bool = False, layer_name: str = "") -> None:
        if bits not in SUPPORTED_BITS:
            raise ValueError(f"kbit: bits must be one of {SUPPORTED_BITS}, got {bits!r}")
        super().__init__(num_experts, hidden_dim, intermediate_dim, act_fn, BLOCK, layer_name)
        self.bits = bits
        for name, (out_f, in_f) in self._shapes().items():
            if quantize_on_load:
                setattr(self, name, _frozen(torch.empty(num_experts, out_f, in_f, dtype=dtype)))
            setattr(self, name + "_packed",
                    _frozen(torch.empty(num_experts, out_f, in_f // BLOCK * bits, dtype=torch.int32)))
            setattr(self, name + "_absmax", _frozen(torch.empty(num_experts, out_f, in_f // BLOCK, dtype=torch.uint8)))
        self.register_buffer("codebook", torch.empty(1 << bits, dtype=torch.float32), persistent=False)

    @classmethod
    def from_experts(cls, experts: nn.Module, bits: int, codebook: torch.Tensor, name: str = "") -> KbitExperts:
        """Quantize an existing fused experts module (outside from_pretrained); returns a resident module."""
        shape = fused_experts_shape(experts)
        if shape is None:
            raise ValueError(f"kbit: '{name}' is not a standard fused experts module (gate_up_proj [E, 2I, H], "
                             "down_proj [E, H, I], no bias, not transposed)")
        gu = experts.gate_up_proj.detach()
        with torch.device("meta"):
            m = cls(*shape, bits, experts.act_fn, gu.dtype, layer_name=name)
        cb = codebook.to(gu.device, torch.float32)
        for proj in EXPERT_PROJS:
            packed, absmax = kbit_quantize_experts(getattr(experts, proj).detach(), cb, bits, f"{name}.{proj}")
            setattr(m, proj + "_packed", _frozen(packed))
            setattr(m, proj + "_absmax", _frozen(absmax))
        m.repack_(cb)
        return m

    def repack_(self, codebook: torch.Tensor) -> None:
        """Serialized -> resident tiled layout per expert; drops float placeholders; sets the codebook."""
        self.codebook = codebook.to(self.gate_up_proj_packed.device, torch.float32).clone()
        if self.resident:
            return
        for proj in EXPERT_PROJS:
            self._parameters.pop(proj, None)
            packed_t, absmax_t = kbit_repack_experts(getattr(self, proj + "_packed").data,
                                                     getattr(self, proj + "_absmax").data, self.bits)
            setattr(self, proj + "_packed", _frozen(packed_t))
            setattr(self, proj + "_absmax", _frozen(absmax_t))
        self.resident = True

    def serialized(self, proj: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed [E, out, in/32*k], absmax [E, out, in/32]) of one projection, whatever the layout."""
        packed, absmax = getattr(self, proj + "_packed").data, getattr(self, proj + "_absmax").data
        if not self.resident:
            return packed, absmax
        return kbit_unrepack_experts(packed, absmax, self.bits, self._shapes()[proj][0])

    def _serialized_state(self, proj: str) -> dict[str, torch.Tensor]:
        return dict(zip(KBIT_EXPERT_SUFFIXES, self.serialized(proj), strict=True))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Dense {"gate_up_proj": [E, 2I, H], "down_proj": [E, H, I]} (tests, debugging)."""
        from .. import ops

        out = {}
        for proj in EXPERT_PROJS:
            packed, absmax = self.serialized(proj)
            out[proj] = torch.stack([ops.kbit_dequantize(packed[e], absmax[e], self.codebook, self.bits, dtype)
                                     for e in range(self.num_experts)])
        return out

    def _grouped(self, proj: str) -> GroupedLinear:
        return kbit_grouped(getattr(self, proj + "_packed"), getattr(self, proj + "_absmax"), self.codebook,
                            self.bits, self._shapes()[proj][0])

    def _experts_op(self) -> ExpertsOp | None:
        return kbit_experts_op(self.gate_up_proj_packed, self.gate_up_proj_absmax, self.down_proj_packed,
                               self.down_proj_absmax, self.codebook, self.bits)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Accept serialized tensors in load_state_dict while resident (repacks them)."""
        for proj in EXPERT_PROJS:
            kp, ka = prefix + proj + "_packed", prefix + proj + "_absmax"
            if self.resident and kp in state_dict and ka in state_dict and state_dict[ka].dim() == 3:
                state_dict[kp], state_dict[ka] = kbit_repack_experts(state_dict[kp], state_dict[ka], self.bits)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bits={self.bits}"
