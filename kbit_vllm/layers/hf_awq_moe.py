"""Hugging Face replacement for transformers 5.x fused MoE experts holding AutoAWQ int4 weights.

An AutoAWQ MoE checkpoint stores every expert's projections as its own "gemm" layer, e.g. for
Mixtral ``model.layers.<l>.block_sparse_moe.experts.<e>.w1.qweight`` / ``qzeros`` / ``scales``
(w3, w2 likewise) and for Qwen3-MoE ``model.layers.<l>.mlp.experts.<e>.{gate,up,down}_proj.*``.
transformers 5.x merges per-expert ``.weight`` tensors into its fused ``gate_up_proj`` /
``down_proj`` while loading; the awq_orin quantizer adds the same merge for the AWQ tensors, so
AwqOrinExperts receives them stacked, in AWQ's [in, out] orientation, gate and up concatenated on
the output (last) dim, as vLLM's AwqOrinMoEMethod holds them:

  ``gate_up_proj_qweight`` int32 [E, H, 2I/8], ``gate_up_proj_qzeros`` int32 [E, H/g, 2I/8],
  ``gate_up_proj_scales`` [E, H/g, 2I]; ``down_proj_qweight`` [E, I, H/8], ``down_proj_qzeros``
  [E, I/g, H/8], ``down_proj_scales`` [E, I/g, H]  (scales in the checkpoint's dtype).

``repack_(dtype)`` builds the stacked resident layout the grouped op reads (``<proj>_wq``,
``<proj>_sz``: non-persistent buffers) and drops ``qweight``; the state dict reads it back with
awq_unrepack, so save_pretrained splits the same AutoAWQ per-expert tensors back out, bit-exactly.
The forward is transformers' experts call on ``kbit_vllm::awq_grouped_linear`` (FusedExperts).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .hf_moe import EXPERT_PROJS, FusedExperts, _frozen
from .moe_compute import (
    GroupedLinear,
    awq_grouped,
    awq_repack_experts,
    awq_unrepack_experts,
    check_expert_scales_finite,
)

AWQ_EXPERT_SUFFIXES = ("_qweight", "_qzeros", "_scales")


class AwqOrinExperts(FusedExperts):
    """A MoE layer's experts from an AutoAWQ "gemm" checkpoint (see the module docstring for tensors)."""

    METHOD = "awq_orin"

    def __init__(self, num_experts: int, hidden_dim: int, intermediate_dim: int, group_size: int,
                 act_fn: Callable[[torch.Tensor], torch.Tensor], scales_dtype: torch.dtype = torch.float32,
                 layer_name: str = "") -> None:
        # group_size is a multiple of 8, so whole groups also give whole int32 packs of 8 outputs
        super().__init__(num_experts, hidden_dim, intermediate_dim, act_fn, group_size, layer_name)
        self.group_size = group_size
        for proj, (out_f, in_f) in self._shapes().items():
            groups = in_f // group_size
            setattr(self, proj + "_qweight",
                    _frozen(torch.empty(num_experts, in_f, out_f // 8, dtype=torch.int32)))
            setattr(self, proj + "_qzeros", _frozen(torch.empty(num_experts, groups, out_f // 8, dtype=torch.int32)))
            setattr(self, proj + "_scales", _frozen(torch.empty(num_experts, groups, out_f, dtype=scales_dtype)))

    def checkpoint_shapes(self) -> dict[str, dict[str, list[int]]]:
        """Shape of each per-expert checkpoint tensor: {proj: {"qweight" | "qzeros" | "scales": shape}};
        gate and up are one such projection each (half of gate_up_proj's outputs)."""
        out = {}
        for proj, (out_f, in_f) in self._shapes().items():
            one = out_f // 2 if proj == "gate_up_proj" else out_f
            groups = in_f // self.group_size
            out[proj] = {"qweight": [in_f, one // 8], "qzeros": [groups, one // 8], "scales": [groups, one]}
        return out

    def repack_(self, dtype: torch.dtype) -> None:
        """AWQ tensors -> stacked resident layout in the activation dtype (checks scales, frees qweight)."""
        if self.resident:
            return
        for proj in EXPERT_PROJS:
            qweight, qzeros, scales = (getattr(self, proj + s).data for s in AWQ_EXPERT_SUFFIXES)
            check_expert_scales_finite(scales, self.layer_name, proj)
            wq, sz = awq_repack_experts(qweight, qzeros, scales, self.group_size, dtype, f"{self.layer_name}.{proj}")
            del self._parameters[proj + "_qweight"]
            self.register_buffer(proj + "_wq", wq, persistent=False)
            self.register_buffer(proj + "_sz", sz, persistent=False)
        self.resident = True

    def _qweight(self, proj: str) -> torch.Tensor:
        if not self.resident:
            return getattr(self, proj + "_qweight").data
        out_f, in_f = self._shapes()[proj]
        return awq_unrepack_experts(getattr(self, proj + "_wq"), in_f, out_f)

    def _serialized_state(self, proj: str) -> dict[str, torch.Tensor]:
        return {"_qweight": self._qweight(proj)}

    def _grouped(self, proj: str) -> GroupedLinear:
        return awq_grouped(getattr(self, proj + "_wq"), getattr(self, proj + "_sz"), self.group_size,
                           self._shapes()[proj][0])

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}"
