"""vLLM LinearMethods for kbit (online and pre-quantized) and awq_orin.

Each method creates the checkpoint-layout parameters through vLLM's parameter classes (so the
tensor-parallel and merged QKV / gate_up loaders shard them), repacks them once into the
resident kernel layout in process_weights_after_loading, and calls a single kbit_vllm:: op in
apply(), which keeps apply() traceable by torch.compile and capturable by CUDA graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import LinearMethodBase
from vllm.model_executor.parameter import (
    BasevLLMParameter,
    GroupQuantScaleParameter,
    ModelWeightParameter,
    PackedvLLMParameter,
)

from .. import ops
from ..formats import AWQ_GROUP_SIZES, BLOCK, check_bits

try:  # present in 0.25.1 .. 0.33.0; guarded so an older vLLM fails only when kbit is used online
    from vllm.model_executor.model_loader.reload.layerwise import initialize_online_processing
except ImportError:  # pragma: no cover - depends on the vLLM version
    initialize_online_processing = None

try:
    from vllm.model_executor.layers.linear import register_weight_loader_v2_supported_method
except ImportError:  # pragma: no cover
    register_weight_loader_v2_supported_method = None

_DONE = "_already_called_process_weights_after_loading"


def _set_param(layer: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Replace (or add) a parameter with a plain frozen one holding the resident layout."""
    if hasattr(layer, name):
        delattr(layer, name)
    layer.register_parameter(name, Parameter(tensor, requires_grad=False))


_QKV_INDEX = {"q": 0, "k": 1, "v": 2}


def checkpoint_name(prefix: str, name: str, shard: Any, mapping: dict[str, list[str]] | None) -> str:
    """The checkpoint tensor a (layer, parameter, shard) comes from: `...qkv_proj` shard "k" of a
    Llama is `...k_proj.<name>`; without a mapping, the fused name and the shard id."""
    if shard is None:
        return f"{prefix}.{name}"
    head, _, last = prefix.rpartition(".")
    shards = (mapping or {}).get(last)
    idx = _QKV_INDEX.get(shard, shard) if isinstance(shard, str) else shard
    if shards and isinstance(idx, int) and 0 <= idx < len(shards):
        return f"{head}.{shards[idx]}.{name}" if head else f"{shards[idx]}.{name}"
    return f"{prefix}.{name} (shard {shard!r})"


def _shard_of(args: tuple, kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))


def _checked_loader(prefix: str, name: str, loader: Callable, dtypes: tuple[torch.dtype, ...],
                    in_cols: int | None, in_desc: str, mapping: dict[str, list[str]] | None = None,
                    finite: bool = False) -> Callable:
    """Wrap a vLLM weight loader so a wrong checkpoint tensor raises an error naming the tensor.

    vLLM's own loaders only `assert` shapes, and vLLM does not report checkpoint tensors that
    never arrived for quantized models; so this checks dtype, rank, columns and (for scales)
    finiteness, and records which shards arrived (check_loaded reads that after loading).
    """

    def load(param: torch.Tensor, loaded_weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        shard = _shard_of(args, kwargs)
        where = checkpoint_name(prefix, name, shard, mapping)
        if loaded_weight.dtype not in dtypes:
            raise ValueError(f"kbit_vllm: checkpoint tensor {where} must have dtype "
                             f"{' or '.join(map(str, dtypes))}, got {loaded_weight.dtype}")
        if loaded_weight.dim() != param.dim():
            raise ValueError(f"kbit_vllm: checkpoint tensor {where} must be {param.dim()}-D, "
                             f"got shape {list(loaded_weight.shape)}")
        if in_cols is not None and loaded_weight.shape[1] != in_cols:
            raise ValueError(f"kbit_vllm: checkpoint tensor {where} must have {in_cols} columns "
                             f"({in_desc}), got shape {list(loaded_weight.shape)}")
        if finite and not bool(torch.isfinite(loaded_weight).all()):
            bad = (~torch.isfinite(loaded_weight)).nonzero()[0].tolist()
            raise ValueError(f"kbit_vllm: checkpoint tensor {where} holds NaN or Inf (first at index {bad}); "
                             "the checkpoint is corrupt")
        try:
            out = loader(param, loaded_weight.to(param.dtype), *args, **kwargs)
        except (AssertionError, RuntimeError) as e:
            raise ValueError(f"kbit_vllm: checkpoint tensor {where} of shape {list(loaded_weight.shape)} "
                             f"does not fit this rank's parameter of shape {list(param.shape)} "
                             f"(shard {args or kwargs}): {e}") from e
        shards = getattr(param, "_kbit_shards", None)
        if shards is None:
            shards = set()
            param._kbit_shards = shards
        shards.add(_QKV_INDEX.get(shard, shard) if isinstance(shard, str) else shard)
        return out

    return load


def check_loaded(layer: torch.nn.Module, prefix: str, names: tuple[str, ...],
                 mapping: dict[str, list[str]] | None) -> None:
    """Raise naming the checkpoint tensors that never arrived (their parameters would stay zero)."""
    n_shards = len(getattr(layer, "logical_widths", None) or [None])
    missing: list[str] = []
    for name in names:
        got = getattr(getattr(layer, name), "_kbit_shards", set())
        if None in got:  # loaded as one (unfused or pre-fused) tensor
            continue
        if n_shards == 1 and not got:
            missing.append(checkpoint_name(prefix, name, None, mapping))
            continue
        missing += [checkpoint_name(prefix, name, i, mapping) for i in range(n_shards) if i not in got]
    if missing:
        raise ValueError(f"kbit_vllm: layer {prefix}: checkpoint tensor(s) {', '.join(missing)} missing from the "
                         "checkpoint; the folder is incomplete or was written for another model")


# --------------------------------------------------------------------------------------------
# kbit
# --------------------------------------------------------------------------------------------


class _KbitLinearBase(LinearMethodBase):
    """Shared apply() and resident-layout bookkeeping of the two kbit methods."""

    def __init__(self, bits: int, codebook: list[float] | None, prefix: str,
                 packed_modules_mapping: dict[str, list[str]] | None = None) -> None:
        check_bits(bits, f"kbit layer {prefix}")
        self.bits = bits
        self.codebook = codebook
        self.prefix = prefix
        self.mapping = packed_modules_mapping

    def _check_in_features(self, input_size_per_partition: int, input_size: int) -> None:
        """Blocks of 32 input channels must not straddle a TP shard or the row end."""
        if input_size % BLOCK or input_size_per_partition % BLOCK:
            raise ValueError(
                f"kbit: layer {self.prefix} has in_features={input_size} (per TP rank "
                f"{input_size_per_partition}); kbit needs a multiple of {BLOCK} per rank. "
                f"List it in modules_to_not_convert to keep it unquantized, or lower tensor_parallel_size.")

    def _default_codebook(self, device: torch.device) -> torch.Tensor:
        from ..quant_config.vllm_kbit import resolve_codebook

        return resolve_codebook(self.bits, self.codebook).to(device)

    def _install(self, layer: torch.nn.Module, packed: torch.Tensor, absmax: torch.Tensor,
                 codebook: torch.Tensor) -> None:
        """Serialized [out, in/32*k] / [out, in/32] -> tiled resident layout, exactly once."""
        out_f = layer.output_size_per_partition
        if tuple(absmax.shape) != (out_f, layer.input_size_per_partition // BLOCK):
            raise ValueError(f"kbit: layer {self.prefix}: weight_absmax is {list(absmax.shape)}, expected "
                             f"[{out_f}, {layer.input_size_per_partition // BLOCK}]")
        packed_t, absmax_t = ops.kbit_repack(packed.contiguous(), absmax.contiguous(), self.bits)
        _set_param(layer, "weight_packed", packed_t)
        _set_param(layer, "weight_absmax", absmax_t)
        _set_param(layer, "codebook", codebook.to(device=packed_t.device, dtype=torch.float32).contiguous())
        layer.kbit_out_features = out_f

    def tie_weights(self, layer: torch.nn.Module, embed_tokens: torch.nn.Module) -> torch.nn.Module:
        """A quantized lm_head cannot share the embedding tensor; the config keeps tied heads float."""
        raise ValueError(f"kbit: layer {self.prefix} is tied to the input embeddings and cannot be quantized; "
                         "drop lm_head from the kbit quantization_config (tied heads stay unquantized)")

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        return ops.kbit_linear(x, layer.weight_packed, layer.weight_absmax, layer.codebook, bias,
                               self.bits, layer.kbit_out_features)


class KbitOnlineLinearMethod(_KbitLinearBase):
    """Quantizes a fp16/bf16 checkpoint layer by layer while it loads.

    The fp weight is created on the meta device and vLLM's layerwise loader materializes it
    only when all of this layer's shards have arrived, so peak memory is the quantized model
    plus one layer in full precision (the pattern of vLLM's online fp8).
    """

    uses_meta_device: bool = True

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs: Any) -> None:
        self._check_in_features(input_size_per_partition, input_size)
        if initialize_online_processing is None:
            raise RuntimeError("kbit: online quantization needs vLLM's layerwise loader "
                               "(vllm.model_executor.model_loader.reload.layerwise, vLLM >= 0.25.1)")
        layer.logical_widths = output_partition_sizes
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = sum(output_partition_sizes)
        # Only the tensor the checkpoint loads lives on meta: any other parameter would keep
        # the layer from reaching its expected element count and delay quantization.
        weight = ModelWeightParameter(
            data=torch.empty(sum(output_partition_sizes), input_size_per_partition, device="meta",
                             dtype=params_dtype),
            input_dim=1, output_dim=0, weight_loader=extra_weight_attrs.get("weight_loader"))
        layer.register_parameter("weight", weight)
        initialize_online_processing(layer)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if getattr(layer, _DONE, False):
            return
        w = layer.weight
        if w.device.type == "meta":
            raise RuntimeError(f"kbit: layer {self.prefix}: weight was never loaded from the checkpoint")
        codebook = self._default_codebook(w.device)
        try:
            packed, absmax = ops.kbit_quantize(w.data, codebook, self.bits)
        except ValueError as e:
            raise ValueError(f"kbit: cannot quantize layer {self.prefix}: {e}") from e
        delattr(layer, "weight")
        self._install(layer, packed, absmax, codebook)
        setattr(layer, _DONE, True)


class KbitLinearMethod(_KbitLinearBase):
    """Loads a pre-quantized kbit checkpoint: weight_packed, weight_absmax, optional codebook.

    Both tensors are 2-D with `out` rows, so column / merged / QKV sharding slices rows and
    row-parallel sharding slices whole 32-channel blocks (k words or one absmax per block).
    """

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs: Any) -> None:
        self._check_in_features(input_size_per_partition, input_size)
        k, out_p, nb_p = self.bits, sum(output_partition_sizes), input_size_per_partition // BLOCK
        nb_full = input_size // BLOCK
        layer_loader = extra_weight_attrs["weight_loader"]
        layer.logical_widths = output_partition_sizes
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = out_p

        packed = ModelWeightParameter(
            data=torch.zeros(out_p, nb_p * k, dtype=torch.int32), input_dim=1, output_dim=0,
            weight_loader=_checked_loader(self.prefix, "weight_packed", layer_loader, (torch.int32,),
                                          nb_full * k, f"in_features/32*bits = {input_size}/32*{k}", self.mapping))
        absmax = GroupQuantScaleParameter(
            data=torch.zeros(out_p, nb_p, dtype=torch.uint8), input_dim=1, output_dim=0,
            weight_loader=_checked_loader(self.prefix, "weight_absmax", layer_loader, (torch.uint8,),
                                          nb_full, f"in_features/32 = {input_size}/32", self.mapping))
        # On the model's device (the default device while vLLM builds the model): a CPU parameter
        # would be moved back to the CPU by vLLM's device_loading_context after processing.
        codebook = BasevLLMParameter(data=self._default_codebook(torch.get_default_device()).clone(),
                                     weight_loader=self._load_codebook)
        layer.register_parameter("weight_packed", packed)
        layer.register_parameter("weight_absmax", absmax)
        layer.register_parameter("codebook", codebook)

    def _load_codebook(self, param: torch.Tensor, loaded_weight: torch.Tensor, *shard: Any, **kw: Any) -> None:
        """A per-layer codebook; shards of one fused layer (q/k/v, gate/up) must agree."""
        n = 1 << self.bits
        where = checkpoint_name(self.prefix, "codebook", _shard_of(shard, kw), self.mapping)
        if tuple(loaded_weight.shape) != (n,):
            raise ValueError(f"kbit: checkpoint tensor {where} must be [{n}] for bits={self.bits}, "
                             f"got {list(loaded_weight.shape)}")
        if not loaded_weight.is_floating_point() or not bool(torch.isfinite(loaded_weight).all()):
            raise ValueError(f"kbit: checkpoint tensor {where} must hold finite floats, got "
                             f"{loaded_weight.dtype} {loaded_weight.tolist()}")
        cb = loaded_weight.to(device=param.device, dtype=torch.float32)
        if getattr(param, "_kbit_loaded", False) and not torch.equal(param.data, cb):
            raise ValueError(f"kbit: layer {self.prefix} fuses several checkpoint layers with different "
                             "codebooks; vLLM runs them as one layer, so they must share one codebook")
        param.data.copy_(cb)
        param._kbit_loaded = True

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if getattr(layer, _DONE, False):
            return
        check_loaded(layer, self.prefix, ("weight_packed", "weight_absmax"), self.mapping)
        self._install(layer, layer.weight_packed.data, layer.weight_absmax.data, layer.codebook.data)
        setattr(layer, _DONE, True)


# --------------------------------------------------------------------------------------------
# awq_orin
# --------------------------------------------------------------------------------------------


class AwqOrinLinearMethod(LinearMethodBase):
    """AutoAWQ GEMM checkpoints (qweight/qzeros int32 [in, out/8], scales [in/G, out])."""

    def __init__(self, group_size: int, prefix: str,
                 packed_modules_mapping: dict[str, list[str]] | None = None) -> None:
        if group_size not in AWQ_GROUP_SIZES:
            raise ValueError(f"awq_orin: group_size must be one of {AWQ_GROUP_SIZES}, got {group_size}")
        self.group_size = group_size
        self.prefix = prefix
        self.mapping = packed_modules_mapping

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs: Any) -> None:
        g, k_p, n_p = self.group_size, input_size_per_partition, sum(output_partition_sizes)
        if k_p % g:
            raise ValueError(f"awq_orin: layer {self.prefix}: in_features per TP rank {k_p} is not a multiple of "
                             f"group_size {g}; lower tensor_parallel_size or keep the layer unquantized")
        if any(s % 8 for s in output_partition_sizes):
            raise ValueError(f"awq_orin: layer {self.prefix}: output widths {output_partition_sizes} must be "
                             "multiples of 8 (eight int4 values per int32)")
        loader = extra_weight_attrs["weight_loader"]
        layer.input_size_per_partition = k_p
        layer.output_size_per_partition = n_p
        layer.logical_widths = output_partition_sizes
        desc = f"out_features/8 for in_features {input_size}"
        qweight = PackedvLLMParameter(
            data=torch.empty(k_p, n_p // 8, dtype=torch.int32), input_dim=0, output_dim=1, packed_dim=1,
            packed_factor=8,
            weight_loader=_checked_loader(self.prefix, "qweight", loader, (torch.int32,), None, desc, self.mapping))
        qzeros = PackedvLLMParameter(
            data=torch.empty(k_p // g, n_p // 8, dtype=torch.int32), input_dim=0, output_dim=1, packed_dim=1,
            packed_factor=8,
            weight_loader=_checked_loader(self.prefix, "qzeros", loader, (torch.int32,), None, desc, self.mapping))
        scales = GroupQuantScaleParameter(
            data=torch.empty(k_p // g, n_p, dtype=params_dtype), input_dim=0, output_dim=1,
            weight_loader=_checked_loader(self.prefix, "scales", loader, (torch.float16, torch.bfloat16, torch.float32),
                                          None, desc, self.mapping, finite=True))
        layer.register_parameter("qweight", qweight)
        layer.register_parameter("qzeros", qzeros)
        layer.register_parameter("scales", scales)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if getattr(layer, _DONE, False):
            return
        check_loaded(layer, self.prefix, ("qweight", "qzeros", "scales"), self.mapping)
        dtype = layer.scales.dtype
        try:
            wq, sz = ops.awq_repack(layer.qweight.data, layer.qzeros.data, layer.scales.data, self.group_size, dtype)
        except ValueError as e:
            raise ValueError(f"awq_orin: layer {self.prefix}: {e}") from e
        for name in ("qweight", "qzeros", "scales"):
            delattr(layer, name)
        _set_param(layer, "awq_wq", wq)
        _set_param(layer, "awq_sz", sz)
        layer.awq_out_features = layer.output_size_per_partition
        setattr(layer, _DONE, True)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        sz = layer.awq_sz
        if sz.dtype != x.dtype:  # only if the model dtype differs from the scales' (e.g. fp32 runs)
            sz = sz.to(x.dtype)
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        return ops.awq_linear(x, layer.awq_wq, sz, bias, self.group_size, layer.awq_out_features)


if register_weight_loader_v2_supported_method is not None:
    # All parameters above are BasevLLMParameter subclasses, so the packing-aware v2 loaders apply.
    for _cls in (KbitLinearMethod, AwqOrinLinearMethod):
        register_weight_loader_v2_supported_method(_cls)
