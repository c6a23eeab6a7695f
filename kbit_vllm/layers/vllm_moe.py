"""vLLM FusedMoE methods: kbit online, kbit pre-quantized, and awq_orin (AutoAWQ MoE checkpoints).

Routing is vLLM's: on GPU the runner's router hands ``apply`` the top-k weights and global
expert ids. vLLM 0.25.1 / 0.28's default router calls ``torch.ops._moe_C.topk_softmax``,
which the CPU build lacks, so on CPU the methods are monolithic and route in
``apply_monolithic`` with vLLM's own torch-native ``select_experts`` (the function vLLM's CPU
MoE uses). Both paths then run layers/moe_compute.moe_forward: sort pairs by local expert on
the device, grouped gate/up op, gated activation, grouped down op, weighted sum. Under tensor
parallelism each rank holds w13 sharded on the intermediate dim and w2 on its input dim and
returns its partial sum; the runner all-reduces.

Parameters, as vLLM's expert loader fills them from per-expert checkpoint tensors
(``experts.<e>.<w1|gate_proj>.<name>`` -> ``w13_<name>``, ``<w2|down_proj>`` -> ``w2_<name>``):
  kbit online     w13_weight [E, 2I, H], w2_weight [E, H, I] on meta, quantized per layer
  kbit folder     w13_weight_packed int32 [E, 2I, H/32*k], w13_weight_absmax uint8 [E, 2I, H/32],
                  w2_weight_packed [E, H, I/32*k], w2_weight_absmax [E, H, I/32]; optional
                  per-expert ``codebook`` tensors (all experts of a projection must agree)
  awq_orin        AutoAWQ: w13_qweight int32 [E, H, 2I/8], w13_qzeros [E, H/G, 2I/8],
                  w13_scales [E, H/G, 2I], w2_qweight [E, I, H/8], w2_qzeros [E, I/G, H/8],
                  w2_scales [E, I/G, H] (is_transposed: AWQ stores [in, out])
After loading they are repacked per expert and stacked into the resident layouts the grouped
ops read (kbit tiled [E, ...]; awq_repack outputs stacked [E, ...]).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn import Parameter
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase
from vllm.model_executor.utils import set_weight_attrs
from vllm.platforms import current_platform

from ..formats import AWQ_GROUP_SIZES, BLOCK, check_bits
from .moe_compute import (
    ExpertsOp,
    awq_grouped,
    awq_repack_experts,
    check_expert_dims,
    check_expert_scales_finite,
    kbit_experts_op,
    kbit_grouped,
    kbit_quantize_experts,
    kbit_repack_experts,
    moe_forward,
)
from .vllm_linear import _DONE, _set_param, initialize_online_processing

W13_SHARDS = 2  # [gate; up]: only gated activations are accepted (vLLM 0.25.1 has no moe.w13_num_shards)

_GATED_ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
}


def _select_experts_fn() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """vLLM's torch-native top-k routing (its CPU MoE path), wherever this vLLM keeps it."""
    try:  # 0.28
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import select_experts
    except ImportError:  # 0.25.1
        from vllm.model_executor.layers.fused_moe.cpu_fused_moe import select_experts
    return select_experts


class _MoEMethodBase(FusedMoEMethodBase):
    """Routing, apply and the checks every method shares; subclasses supply the two grouped GEMMs."""

    method = ""

    def __init__(self, moe: Any, prefix: str) -> None:
        super().__init__(moe)
        self.prefix = prefix
        act = getattr(moe.activation, "value", moe.activation)
        if act not in _GATED_ACTS:
            raise NotImplementedError(
                f"{self.method}: MoE layer {prefix} uses activation {act!r}; supported are the gated "
                f"{sorted(_GATED_ACTS)} (gate * act(up)). Keep the experts unquantized (modules_to_not_convert)")
        if getattr(moe, "has_bias", False):
            raise NotImplementedError(f"{self.method}: MoE layer {prefix} has expert biases, which are not "
                                      "supported; keep the experts unquantized (modules_to_not_convert)")
        self.act_fn = _GATED_ACTS[act]
        self.act_name = act  # the fused moe_gated_act

    def get_fused_moe_quant_config(self, layer: torch.nn.Module) -> None:
        return None  # no vLLM modular kernel: apply() runs our grouped ops

    @property
    def is_monolithic(self) -> bool:
        # vLLM's default router needs _moe_C.topk_softmax, absent from the CPU build.
        return current_platform.is_cpu()

    def _check_dims(self, hidden: int, inter_p: int, inter_full: int, block: int) -> None:
        check_expert_dims(self.prefix, self.method, hidden, inter_p, block,
                          f"intermediate size per TP rank (full {inter_full})")

    def _w13(self, layer: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        raise NotImplementedError

    def _w2(self, layer: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        raise NotImplementedError

    def _experts_op(self, layer: torch.nn.Module) -> ExpertsOp | None:
        """All of moe_forward as one op, where the method has it (kbit, one codebook for w13 and w2)."""
        return None

    def _experts(self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor) -> torch.Tensor:
        return moe_forward(x, topk_weights, topk_ids, layer.local_num_experts, self._w13(layer), self._w2(layer),
                           self.act_fn, expert_map=layer.expert_map, act_name=self.act_name,
                           apply_router_weight_on_input=bool(layer.apply_router_weight_on_input),
                           experts_op=self._experts_op(layer))

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              shared_experts: Any = None, shared_experts_input: torch.Tensor | None = None) -> torch.Tensor:
        return self._experts(layer, x, topk_weights, topk_ids)

    def apply_monolithic(self, layer: torch.nn.Module, x: torch.Tensor, router_logits: torch.Tensor,
                         input_ids: torch.Tensor | None = None) -> torch.Tensor:
        topk_weights, topk_ids = _select_experts_fn()(
            hidden_states=x, router_logits=router_logits, top_k=layer.top_k,
            use_grouped_topk=layer.use_grouped_topk, renormalize=layer.renormalize,
            topk_group=layer.topk_group, num_expert_group=layer.num_expert_group,
            custom_routing_function=layer.custom_routing_function, scoring_func=layer.scoring_func,
            routed_scaling_factor=layer.routed_scaling_factor,
            e_score_correction_bias=layer.e_score_correction_bias)
        return self._experts(layer, x, topk_weights, topk_ids)


# --------------------------------------------------------------------------------------------
# kbit
# --------------------------------------------------------------------------------------------


class _KbitMoEBase(_MoEMethodBase):
    method = "kbit"

    def __init__(self, moe: Any, bits: int, codebook: list[float] | None, prefix: str) -> None:
        super().__init__(moe, prefix)
        check_bits(bits, f"kbit MoE layer {prefix}")
        self.bits = bits
        self.codebook = codebook

    def _config_codebook(self, device: torch.device) -> torch.Tensor:
        from ..quant_config.vllm_kbit import resolve_codebook

        return resolve_codebook(self.bits, self.codebook).to(device)

    def _install(self, layer: torch.nn.Module, name: str, packed: torch.Tensor, absmax: torch.Tensor,
                 codebook: torch.Tensor) -> None:
        """Serialized [E, out, ...] -> tiled resident params <name>_packed/_absmax/_codebook."""
        packed_t, absmax_t = kbit_repack_experts(packed, absmax, self.bits)
        _set_param(layer, f"{name}_packed", packed_t)
        _set_param(layer, f"{name}_absmax", absmax_t)
        _set_param(layer, f"{name}_codebook", codebook.to(device=packed_t.device, dtype=torch.float32).contiguous())
        setattr(layer, f"kbit_{name}_out", packed.shape[1])
        if name == "w2":  # at load, so the forward never compares (a host sync)
            layer.kbit_shared_codebook = bool(torch.equal(layer.w13_codebook, layer.w2_codebook))

    def _w13(self, layer: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return kbit_grouped(layer.w13_packed, layer.w13_absmax, layer.w13_codebook, self.bits, layer.kbit_w13_out)

    def _w2(self, layer: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return kbit_grouped(layer.w2_packed, layer.w2_absmax, layer.w2_codebook, self.bits, layer.kbit_w2_out)

    def _experts_op(self, layer: torch.nn.Module) -> ExpertsOp | None:
        if not getattr(layer, "kbit_shared_codebook", False):
            return None
        return kbit_experts_op(layer.w13_packed, layer.w13_absmax, layer.w2_packed, layer.w2_absmax,
                               layer.w13_codebook, self.bits)


class KbitOnlineMoEMethod(_KbitMoEBase):
    """Quantizes fp16/bf16 experts while loading (vLLM's layerwise meta-device path, as online fp8).

    Peak memory is the quantized model plus one MoE layer in full precision.
    """

    uses_meta_device: bool = True

    def create_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs: Any) -> None:
        inter = intermediate_size_per_partition
        self._check_dims(hidden_size, inter, layer.moe_config.intermediate_size, BLOCK)
        if initialize_online_processing is None:
            raise RuntimeError("kbit: online quantization needs vLLM's layerwise loader (vLLM >= 0.25.1)")
        attrs = {"weight_loader": extra_weight_attrs["weight_loader"]}
        # Only what the checkpoint loads lives on meta (see KbitOnlineLinearMethod).
        for name, shape in (("w13_weight", (num_experts, W13_SHARDS * inter, hidden_size)),
                            ("w2_weight", (num_experts, hidden_size, inter))):
            p = Parameter(torch.empty(shape, device="meta", dtype=params_dtype), requires_grad=False)
            layer.register_parameter(name, p)
            set_weight_attrs(p, attrs)
        initialize_online_processing(layer)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if getattr(layer, _DONE, False):
            return
        for name in ("w13", "w2"):
            w = getattr(layer, f"{name}_weight")
            if w.device.type == "meta":
                raise RuntimeError(f"kbit: MoE layer {self.prefix}: {name}_weight was never loaded from the checkpoint")
            codebook = self._config_codebook(w.device)
            packed, absmax = kbit_quantize_experts(w.data, codebook, self.bits, f"{self.prefix}.{name}")
            delattr(layer, f"{name}_weight")
            self._install(layer, name, packed, absmax, codebook)
        setattr(layer, _DONE, True)


class KbitMoEMethod(_KbitMoEBase):
    """Loads per-expert kbit tensors (weight_packed / weight_absmax / optional codebook)."""

    def create_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs: Any) -> None:
        inter, inter_full, k = intermediate_size_per_partition, layer.moe_config.intermediate_size, self.bits
        self._check_dims(hidden_size, inter, inter_full, BLOCK)
        loader = extra_weight_attrs["weight_loader"]
        shapes = {  # name -> (per-rank shape, checkpoint columns, what the columns are)
            "w13_weight_packed": ((num_experts, W13_SHARDS * inter, hidden_size // BLOCK * k),
                                  hidden_size // BLOCK * k, f"hidden_size/32*bits = {hidden_size}/32*{k}"),
            "w13_weight_absmax": ((num_experts, W13_SHARDS * inter, hidden_size // BLOCK),
                                  hidden_size // BLOCK, f"hidden_size/32 = {hidden_size}/32"),
            "w2_weight_packed": ((num_experts, hidden_size, inter // BLOCK * k),
                                 inter_full // BLOCK * k, f"intermediate_size/32*bits = {inter_full}/32*{k}"),
            "w2_weight_absmax": ((num_experts, hidden_size, inter // BLOCK),
                                 inter_full // BLOCK, f"intermediate_size/32 = {inter_full}/32"),
        }
        for name, (shape, cols, desc) in shapes.items():
            dtype = torch.int32 if name.endswith("packed") else torch.uint8
            p = Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, p)
            set_weight_attrs(p, {"weight_loader": self._checked(loader, name, dtype, cols, desc)})
        for name in ("w13_codebook", "w2_codebook"):
            # the model's device (see vllm_linear.py: CPU parameters are moved back after loading)
            p = Parameter(self._config_codebook(torch.get_default_device()).clone(), requires_grad=False)
            layer.register_parameter(name, p)
            set_weight_attrs(p, {"weight_loader": self._codebook_loader(name)})

    def _checked(self, loader: Callable, name: str, dtype: torch.dtype, cols: int, desc: str) -> Callable:
        """vLLM's expert loader only asserts shapes; name the layer and tensor instead."""

        def load(param: torch.Tensor, loaded_weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            where = f"{self.prefix}.{name} (checkpoint {kwargs.get('weight_name', name)}, " \
                    f"expert {kwargs.get('expert_id', '?')}, shard {kwargs.get('shard_id', '?')})"
            if loaded_weight.dtype != dtype:
                raise ValueError(f"kbit: MoE tensor {where} must be {dtype}, got {loaded_weight.dtype}")
            if loaded_weight.dim() not in (2, 3) or loaded_weight.shape[-1] != cols:
                raise ValueError(f"kbit: MoE tensor {where} must have {cols} columns ({desc}), got shape "
                                 f"{list(loaded_weight.shape)}; was it written with other bits or another model?")
            try:
                out = loader(param, loaded_weight, *args, **kwargs)
            except (AssertionError, RuntimeError) as e:
                raise ValueError(f"kbit: MoE tensor {where} of shape {list(loaded_weight.shape)} does not fit "
                                 f"this rank's parameter {list(param.shape)}: {e}") from e
            if out is not False:  # False: an expert of another rank (expert parallelism)
                seen = getattr(param, "_kbit_seen", None)
                if seen is None:
                    seen = param._kbit_seen = set()
                seen.add((kwargs.get("expert_id"), kwargs.get("shard_id")))
            return out

        return load

    def _check_loaded(self, layer: torch.nn.Module) -> None:
        """Raise naming the expert tensors that never arrived (their parameters would stay zero)."""
        for name, shards in (("w13", ("w1", "w3")), ("w2", ("w2",))):
            for part in ("weight_packed", "weight_absmax"):
                param = getattr(layer, f"{name}_{part}")
                # a shard id other than w1/w3/w2 (a fused gate_up tensor per expert) covers all shards
                seen = {(e, t) for e, sh in getattr(param, "_kbit_seen", set())
                        for t in ((sh,) if sh in shards else shards)}
                n_exp = param.shape[0]
                if len(seen) >= n_exp * len(shards):
                    continue
                ids = sorted({e for e, _ in seen if e is not None})
                raise ValueError(
                    f"kbit: MoE layer {self.prefix}: only {len(seen)} of the {n_exp * len(shards)} expert tensors "
                    f"of {name}_{part} ({'/'.join(shards)} per expert, {n_exp} experts on this rank) arrived from the "
                    f"checkpoint (experts seen: {ids[:16]}{' ...' if len(ids) > 16 else ''}); the folder is "
                    "incomplete or was written for another model")

    def _codebook_loader(self, name: str) -> Callable:
        """One codebook per projection of a MoE layer: every expert's copy must agree."""

        def load(param: torch.Tensor, loaded_weight: torch.Tensor, *args: Any, **kwargs: Any) -> bool | None:
            n = 1 << self.bits
            if tuple(loaded_weight.shape) != (n,):
                raise ValueError(f"kbit: MoE layer {self.prefix}: checkpoint codebook {kwargs.get('weight_name', name)}"
                                 f" must be [{n}] for bits={self.bits}, got {list(loaded_weight.shape)}")
            cb = loaded_weight.to(torch.float32)
            if getattr(param, "_kbit_loaded", False) and not torch.equal(param.data, cb.to(param.device)):
                raise ValueError(f"kbit: MoE layer {self.prefix}: experts have different {name} tensors; a "
                                 "vLLM MoE layer runs one codebook per projection")
            param.data.copy_(cb)
            param._kbit_loaded = True
            return True if kwargs.get("return_success") else None

        return load

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if getattr(layer, _DONE, False):
            return
        self._check_loaded(layer)
        for name in ("w13", "w2"):
            packed, absmax = getattr(layer, f"{name}_weight_packed").data, getattr(layer, f"{name}_weight_absmax").data
            codebook = getattr(layer, f"{name}_codebook").data
            for n in ("weight_packed", "weight_absmax", "codebook"):
                delattr(layer, f"{name}_{n}")
            self._install(layer, name, packed, absmax, codebook)
        setattr(layer, _DONE, True)


# --------------------------------------------------------------------------------------------
# awq_orin
# --------------------------------------------------------------------------------------------


class AwqOrinMoEMethod(_MoEMethodBase):
    """AutoAWQ GEMM MoE checkpoints (per-expert qweight / qzeros / scales) on the grouped AWQ op."""

    method = "awq_orin"

    def __init__(self, moe: Any, group_size: int, prefix: str) -> None:
        super().__init__(moe, prefix)
        if group_size not in AWQ_GROUP_SIZES:
            raise ValueError(f"awq_orin: group_size must be one of {AWQ_GROUP_SIZES}, got {group_size}")
        self.group_size = group_size

    def create_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs: Any) -> None:
        from vllm.model_executor.layers.fused_moe import FusedMoeWeightScaleSupported

        g, inter, hid = self.group_size, intermediate_size_per_partition, hidden_size
        self._check_dims(hid, inter, layer.moe_config.intermediate_size, g)
        if inter % 8 or hid % 8:
            raise ValueError(f"awq_orin: MoE layer {self.prefix}: hidden {hid} and intermediate per rank {inter} "
                             "must be multiples of 8 (eight int4 values per int32)")
        w13 = W13_SHARDS * inter
        # AWQ stores [in, out]: is_transposed makes vLLM's loader shard the other dim.
        attrs = {"weight_loader": extra_weight_attrs["weight_loader"], "is_transposed": True,
                 "quant_method": FusedMoeWeightScaleSupported.GROUP.value}
        shapes = {
            "w13_qweight": ((num_experts, hid, w13 // 8), torch.int32),
            "w13_qzeros": ((num_experts, hid // g, w13 // 8), torch.int32),
            "w13_scales": ((num_experts, hid // g, w13), params_dtype),
            "w2_qweight": ((num_experts, inter, hid // 8), torch.int32),
            "w2_qzeros": ((num_experts, inter // g, hid // 8), torch.int32),
            "w2_scales": ((num_experts, inter // g, hid), params_dtype),
        }
        for name, (shape, dtype) in shapes.items():
            p = Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, p)
            set_weight_attrs(p, attrs)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if getattr(layer, _DONE, False):
            return
        dtype = layer.w13_scales.dtype
        for name in ("w13", "w2"):
            qw, qz, sc = (getattr(layer, f"{name}_{n}").data for n in ("qweight", "qzeros", "scales"))
            check_expert_scales_finite(sc, self.prefix, name)
            wq, sz = awq_repack_experts(qw, qz, sc, self.group_size, dtype, f"{self.prefix}.{name}")
            for n in ("qweight", "qzeros", "scales"):
                delattr(layer, f"{name}_{n}")
            _set_param(layer, f"{name}_wq", wq)
            _set_param(layer, f"{name}_sz", sz)
            setattr(layer, f"awq_{name}_out", sc.shape[-1])
        setattr(layer, _DONE, True)

    def _grouped(self, layer: torch.nn.Module, name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return awq_grouped(getattr(layer, f"{name}_wq"), getattr(layer, f"{name}_sz"), self.group_size,
                           getattr(layer, f"awq_{name}_out"))

    def _w13(self, layer: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return self._grouped(layer, "w13")

    def _w2(self, layer: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return self._grouped(layer, "w2")
