"""Hugging Face HfQuantizers for "kbit" and "awq_orin", and their registration.

Written against the transformers 5.x loader (5.17 and 5.23): modules are replaced on the meta
model before loading; on-the-fly kbit goes through ``param_needs_quantization`` +
``get_quantize_ops``; pre-quantized tensors load by key onto exact placeholders; after
loading every layer is repacked once into its resident layout. See shared notes/hf_api.md.
"""

from __future__ import annotations

import logging
import re
from copy import deepcopy
from typing import Any

import torch
from torch import nn
from transformers.core_model_loading import ConversionOps, MergeModulelist, SplitModulelist
from transformers.quantizers import HfQuantizer
from transformers.quantizers import auto as hf_auto
from transformers.quantizers.quantizers_utils import get_module_from_name, should_convert_module

from ..formats import normal_float_codebook
from ..layers.hf_awq_moe import AWQ_EXPERT_SUFFIXES, AwqOrinExperts
from ..layers.hf_linear import KBIT_SERIALIZED, AwqOrinLinear, KbitLinear, check_kbit_shape
from ..layers.hf_moe import (
    EXPERT_PROJS,
    KBIT_EXPERT_SUFFIXES,
    FusedExperts,
    KbitExperts,
    fused_experts_shape,
    has_fused_experts,
)
from ..layers.moe_compute import kbit_quantize_experts
from ..ops import kbit_quantize
from .hf_configs import AwqOrinConfig, KbitConfig, ties_word_embeddings

logger = logging.getLogger("kbit_vllm")

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _progress(items: list, desc: str):
    """tqdm over long loops (transformers ships tqdm); plain list when short or unavailable."""
    if len(items) < 64:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc)


def _linears_to_convert(model: nn.Module, skip: list[str]) -> list[tuple[str, nn.Linear]]:
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and should_convert_module(n, skip)]


def _check_device_map(method: str, device_map: Any) -> None:
    """Resident layouts are repacked after accelerate dispatch, so offloading hooks would hold stale tensors."""
    if not isinstance(device_map, dict):
        return
    devices = {str(v) for v in device_map.values()}
    if "disk" in devices or ("cpu" in devices and len(devices) > 1):
        raise ValueError(
            f"{method}: device_map {device_map} offloads modules to cpu/disk next to an accelerator; this is "
            "not supported. Put the whole model on the GPU(s), or on the CPU."
        )


_ST_DTYPES = {"I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
              "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
              "BOOL": torch.bool}


def _checkpoint_index(checkpoint_files: list[str] | None) -> dict[str, tuple[str, list[int], str]]:
    """name -> (safetensors dtype string, shape, file) from the headers only; {} when unknown."""
    index: dict[str, tuple[str, list[int], str]] = {}
    for f in checkpoint_files or []:
        if not str(f).endswith(".safetensors"):
            continue
        from safetensors import safe_open

        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                sl = fh.get_slice(name)
                index[name] = (sl.get_dtype(), list(sl.get_shape()), str(f))
    return index


def check_checkpoint_tensor(index: dict[str, tuple[str, list[int], str]], name: str,
                            dtypes: tuple[torch.dtype, ...], shape: list[int], method: str, hint: str = "") -> None:
    """Raise naming the tensor when the checkpoint holds it with another dtype or shape.

    transformers casts a checkpoint tensor to the placeholder's dtype (a float weight_packed would
    silently become integers) and reports shape mismatches only in a log table, so the headers
    are checked before loading."""
    if name not in index:
        return  # absent: reported after loading, with the layer's expected tensors
    st_dtype, got_shape, _ = index[name]
    got = _ST_DTYPES.get(st_dtype)
    if got not in dtypes:
        raise ValueError(f"{method}: checkpoint tensor {name} has dtype {got or st_dtype}, expected "
                         f"{' or '.join(map(str, dtypes))}")
    if got_shape != shape:
        raise ValueError(f"{method}: checkpoint tensor {name} has shape {got_shape}, expected {shape}{hint}")


def _finite_or_raise(t: torch.Tensor, name: str, method: str) -> None:
    if not bool(torch.isfinite(t).all()):
        idx = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise ValueError(f"{method}: checkpoint tensor {name} holds NaN or Inf (first at index {idx}); "
                         "the checkpoint is corrupt")


def _loaded(t: torch.Tensor) -> bool:
    return bool(getattr(t, "_is_hf_initialized", False)) and t.device.type != "meta"


def _resolved_skips(quantizer: HfQuantizer, model: nn.Module, requested: list[str] | None) -> list[str]:
    skip = quantizer.get_modules_to_not_convert(model, requested, model._keep_in_fp32_modules,
                                                add_default_skips=True)
    return sorted(set(skip))


def _quantized_lm_head(model: nn.Module, requested: list[str] | None) -> str | None:
    """The output projection's name when KbitConfig(lm_head=True) may quantize it, else None.

    A head tied to the input embeddings stays float (one tensor serves both, and the embedding
    lookup needs it whole); listing it in modules_to_not_convert as well is a contradiction.
    """
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        logger.warning("kbit: lm_head=True but the model's output embeddings are %s, not a Linear; kept as is",
                       type(head).__name__)
        return None
    name = next(n for n, m in model.named_modules() if m is head)
    if requested and not should_convert_module(name, requested):
        raise ValueError(f"KbitConfig: lm_head=True but modules_to_not_convert={requested} keeps '{name}' in float")
    tied = {k.removesuffix(".weight") for kv in getattr(model, "all_tied_weights_keys", {}).items() for k in kv}
    if name in tied or ties_word_embeddings(model.config):
        logger.warning("kbit: lm_head=True, but '%s' is tied to the input embeddings; it stays in float", name)
        return None
    return name


def _awq_scales_dtype(index: dict[str, tuple[str, list[int], str]]) -> torch.dtype:
    """The checkpoint's scales dtype, so scales load and save unchanged; fp32 (lossless) if unknown or mixed."""
    found = {_ST_DTYPES.get(dt) for name, (dt, _, _) in index.items() if name.endswith(".scales")}
    return found.pop() if len(found) == 1 and found <= set(_FLOAT_DTYPES) else torch.float32


def _log_experts_left(model: nn.Module, method: str, skip: list[str] | None = None) -> None:
    """Fused 3-D expert modules left in the model dtype: explicitly skipped, or a layout we do not handle."""
    experts = [n for n, m in model.named_modules() if has_fused_experts(m) and not isinstance(m, FusedExperts)]
    if experts:
        why = "skipped or not a supported layout" if skip is not None else "not supported by this method"
        logger.warning("%s: %d fused MoE expert modules (e.g. '%s') are not quantized (%s) and stay in the "
                       "model dtype", method, len(experts), experts[0], why)


def _experts_to_convert(model: nn.Module, skip: list[str]) -> list[tuple[str, nn.Module, tuple[int, int, int]]]:
    out = []
    for name, m in model.named_modules():
        shape = fused_experts_shape(m)
        if shape is not None and should_convert_module(name, skip):
            out.append((name, m, shape))
    return out


KBIT_EXPERT_COMPANIONS = {suffix: "weight" + suffix for suffix in KBIT_EXPERT_SUFFIXES}
AWQ_EXPERT_COMPANIONS = {suffix: suffix[1:] for suffix in AWQ_EXPERT_SUFFIXES}


class _SplitKeepingDims(SplitModulelist):
    """SplitModulelist that removes only the split dim: transformers before ~5.2x squeezed every
    size-1 dim on save, so a single-group AWQ qzeros [1, out/8] per expert came out [out/8]."""

    def convert(self, input_dict: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        shapes = []
        for tensors in input_dict.values():
            t = tensors[0] if isinstance(tensors, list) else tensors
            shapes.append(t.shape[: self.dim] + t.shape[self.dim + 1:])
        out = super().convert(input_dict, *args, **kwargs)
        for key, v in out.items():
            want = next((sh for sh in shapes if sh.numel() == v.numel()), v.shape)
            out[key] = v.reshape(want)
        return out

    @property
    def reverse_op(self) -> ConversionOps:
        return _MergeKeepingDims(self.dim)


class _MergeKeepingDims(MergeModulelist):
    """MergeModulelist whose save-time inverse keeps the per-expert tensors' size-1 dims."""

    @property
    def reverse_op(self) -> ConversionOps:
        return _SplitKeepingDims(self.dim)


def _keeping_dims(operations: list[Any]) -> list[Any]:
    """The converter's ops with each MergeModulelist made to keep size-1 dims when saving."""
    return [_MergeKeepingDims(op.dim) if type(op) is MergeModulelist else op for op in operations]


def _in_out_merge_ops(operations: list[Any]) -> list[Any] | None:
    """A [E, out, in] experts merge (stack, then concatenate gate and up on the out dim) redone for
    tensors stored [in, out] like AWQ's; None when the converter does anything else."""
    from transformers.core_model_loading import Concatenate, MergeModulelist

    out = []
    for op in operations:
        if isinstance(op, MergeModulelist) and op.dim == 0:
            out.append(deepcopy(op))
        elif isinstance(op, Concatenate) and op.dim in (1, -2):
            new = deepcopy(op)
            new.dim = 2
            out.append(new)
        else:
            return None
    return out


def _companion_expert_converters(conversions: list[Any], projs: set[str], companions: dict[str, str],
                                 in_out: bool = False) -> list[Any]:
    """Copies of the model's per-expert merge converters for the quantized companions.

    ``companions`` maps a stacked param's suffix to the checkpoint's per-expert leaf name. E.g.
    Mixtral's ``.experts.*.w1.weight`` + ``.experts.*.w3.weight`` -> ``.experts.gate_up_proj`` gets,
    for kbit, ``.experts.*.w1.weight_packed`` + ``...w3.weight_packed`` -> ``.experts.gate_up_proj_packed``
    (same for ``_absmax``) with the same merge ops; for awq_orin ``.experts.*.w1.qweight`` + ... ->
    ``.experts.gate_up_proj_qweight`` (``qzeros``, ``scales`` likewise), concatenated on the last dim
    (``in_out``: AWQ stores [in, out]). Loading merges saved per-expert tensors into the stacked
    params; saving reverses it, so the folder keeps the checkpoint's per-expert names.
    """
    from transformers.core_model_loading import WeightConverter

    existing = {tuple(getattr(c, "_original_target_patterns", c.target_patterns)) for c in conversions}
    out = []
    for conv in conversions:
        if not isinstance(conv, WeightConverter):
            continue
        sources = list(getattr(conv, "_original_source_patterns", conv.source_patterns))
        targets = list(getattr(conv, "_original_target_patterns", conv.target_patterns))
        if (len(targets) != 1 or targets[0].rpartition(".")[2] not in projs
                or not all(src.endswith(".weight") for src in sources)):
            continue
        operations = _in_out_merge_ops(conv.operations) if in_out else conv.operations
        if operations is None:
            continue
        operations = _keeping_dims(operations)
        for suffix, leaf in companions.items():
            new_src, new_tgt = [src[: -len("weight")] + leaf for src in sources], [targets[0] + suffix]
            if tuple(new_tgt) in existing:
                continue
            if hasattr(conv, "copy"):
                out.append(conv.copy(new_src, new_tgt, operations=deepcopy(operations)))
            else:  # pragma: no cover - transformers without WeightTransform.copy
                new = WeightConverter(source_patterns=new_src, target_patterns=new_tgt,
                                      operations=deepcopy(operations))
                for attr in ("scope_prefix", "base_model_prefix"):
                    if hasattr(conv, attr):
                        setattr(new, attr, getattr(conv, attr))
                out.append(new)
            existing.add(tuple(new_tgt))
    return out


def _keep_expert_converters(model: nn.Module, companions: dict[str, str], in_out: bool = False) -> None:
    """save_pretrained reverses model._weight_conversions: add the companions' converters (dropped when
    no checkpoint key used them, e.g. quantized on the fly) so experts are saved per expert, like the
    checkpoint they came from."""
    used = getattr(model, "_weight_conversions", None)
    if used is not None:
        model._weight_conversions = list(used) + _companion_expert_converters(used, set(EXPERT_PROJS), companions,
                                                                              in_out)


_AWQ_EXPERT_KEY = re.compile(r"^(?P<prefix>.*)\.experts\.(?P<e>\d+)\.(?P<proj>[^.]+)\.(?P<t>qweight|qzeros|scales)$")
_AWQ_DTYPES = {"qweight": (torch.int32,), "qzeros": (torch.int32,), "scales": _FLOAT_DTYPES}


def _expert_checkpoint_keys(quantizer: HfQuantizer, model: nn.Module, index: dict[str, tuple[str, list[int], str]],
                            experts: dict[str, AwqOrinExperts]) -> dict[str, tuple[str, dict[Any, Any]]]:
    """{module: (checkpoint prefix, {(group, proj): {tensor: {expert: key}}})} for the AutoAWQ per-expert keys,
    mapped with the renamings and converters the loader will use; {} when this transformers cannot say."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        mapping = get_model_conversion_mapping(model, hf_quantizer=quantizer)
    except (ImportError, TypeError):  # pragma: no cover - another loader API; the check after loading names the layer
        return {}
    renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    meta = model.state_dict()
    found: dict[str, tuple[str, dict[Any, Any]]] = {}
    for key in index:
        match = _AWQ_EXPERT_KEY.match(key)
        if match is None:
            continue
        renamed, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, meta)
        module, _, param = renamed.rpartition(".")
        if pattern is None or module not in experts:
            continue
        group = param.rpartition("_")[0]  # gate_up_proj_qweight -> gate_up_proj
        tensors = found.setdefault(module, (match["prefix"], {}))[1].setdefault((group, match["proj"]), {})
        tensors.setdefault(match["t"], {})[int(match["e"])] = key
    return found


def _check_awq_expert_checkpoint(quantizer: HfQuantizer, model: nn.Module,
                                 index: dict[str, tuple[str, list[int], str]]) -> None:
    """Every per-expert AutoAWQ tensor of every AwqOrinExperts, from the safetensors headers, before loading.

    The loader would only log a failed merge (a missing or mis-shaped expert) and leave the stacked
    param empty; this names the layer, projection, expert and checkpoint tensor instead. Layers with
    no AWQ expert tensors at all are reported after loading (with the modules_to_not_convert hint).
    """
    experts = {n: m for n, m in model.named_modules() if isinstance(m, AwqOrinExperts)}
    if not experts or not index:
        return
    for name, (prefix, found) in _expert_checkpoint_keys(quantizer, model, index, experts).items():
        m = experts[name]
        for group, shapes in m.checkpoint_shapes().items():
            projs = sorted(p for g, p in found if g == group)
            need = 2 if group == "gate_up_proj" else 1
            if len(projs) != need:
                raise ValueError(f"awq_orin: MoE experts '{name}': the checkpoint's {group} tensors come from "
                                 f"projection(s) {projs} ({prefix}.experts.<e>.<proj>.*), expected {need}")
            for proj in projs:
                for tensor, shape in shapes.items():
                    keys = found[(group, proj)].get(tensor, {})
                    extra = sorted(e for e in keys if e >= m.num_experts)
                    if extra:
                        raise ValueError(f"awq_orin: checkpoint tensor {keys[extra[0]]} is for expert {extra[0]}, "
                                         f"but MoE experts '{name}' has {m.num_experts} experts")
                    for e in range(m.num_experts):
                        where = f" (MoE experts '{name}', projection {proj}, expert {e})"
                        if e not in keys:
                            raise ValueError(f"awq_orin: checkpoint tensor {prefix}.experts.{e}.{proj}.{tensor} is "
                                             f"missing{where}; expected {_AWQ_DTYPES[tensor][0]} {shape}")
                        check_checkpoint_tensor(index, keys[e], _AWQ_DTYPES[tensor], shape, "awq_orin", where)


class KbitQuantizeOp(ConversionOps):
    """On-the-fly: float ``<layer>.weight`` -> ``weight_packed``, ``weight_absmax``, ``codebook``.

    Also returns an empty ``weight`` so the loader does not re-create the float placeholder as
    a missing key (it is deleted by repack_).
    """

    def __init__(self, hf_quantizer: KbitHfQuantizer) -> None:
        self.hf_quantizer = hf_quantizer

    def convert(self, input_dict: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        qc = self.hf_quantizer.quantization_config
        out: dict[str, torch.Tensor] = {}
        for key, value in input_dict.items():
            w = value[0] if isinstance(value, list) else value
            if w.dim() == 3:  # fused experts `<module>.gate_up_proj` / `.down_proj` [E, out, in]
                codebook = self.hf_quantizer.codebook(w.device)
                out[key + "_packed"], out[key + "_absmax"] = kbit_quantize_experts(w, codebook, qc.bits, key)
                out[key] = w.new_empty(0)
                self.hf_quantizer.n_quantized += 1
                continue
            prefix = key[: -len("weight")]
            layer = prefix.rstrip(".")
            codebook = self.hf_quantizer.codebook(w.device)
            try:
                packed, absmax = kbit_quantize(w, codebook, qc.bits)
            except ValueError as e:
                raise ValueError(f"kbit: cannot quantize '{layer}': {e}") from e
            out[prefix + "weight_packed"] = packed
            out[prefix + "weight_absmax"] = absmax
            out[prefix + "codebook"] = codebook.clone()
            out[key] = w.new_empty(0)
            self.hf_quantizer.n_quantized += 1
        return out

    @property
    def reverse_op(self) -> ConversionOps:
        raise NotImplementedError("kbit: quantization is not reversible; kbit modules save their own format")


class _WeightOnlyQuantizer(HfQuantizer):
    """What the kbit and awq_orin quantizers share: device map, dtype and capability answers."""

    METHOD = ""
    DEFAULT_DTYPE = torch.bfloat16
    dtype: torch.dtype | None = None

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        _check_device_map(self.METHOD, kwargs.get("device_map"))

    def update_device_map(self, device_map: dict[str, Any] | None) -> dict[str, Any] | None:
        if device_map is None and torch.cuda.is_available():
            return {"": torch.cuda.current_device()}
        return device_map

    def update_dtype(self, dtype: torch.dtype | None) -> torch.dtype:
        if dtype is None:
            dtype = self.DEFAULT_DTYPE
        if dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{self.METHOD}: model dtype must be one of {_FLOAT_DTYPES}, got {dtype}")
        self.dtype = dtype
        return dtype

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


class KbitHfQuantizer(_WeightOnlyQuantizer):
    """Quantizes float checkpoints to kbit while loading, and loads saved kbit checkpoints."""

    METHOD = "kbit"
    DEFAULT_DTYPE = torch.bfloat16
    requires_calibration = False
    quantization_config: KbitConfig

    def __init__(self, quantization_config: KbitConfig, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        self.n_quantized = 0
        self._codebooks: dict[str, torch.Tensor] = {}

    def codebook(self, device: torch.device) -> torch.Tensor:
        """The config's codebook (or the normal-float default) on device, fp32."""
        key = str(device)
        if key not in self._codebooks:
            cb = self.quantization_config.codebook
            self._codebooks[key] = (normal_float_codebook(self.quantization_config.bits, device) if cb is None
                                    else torch.tensor(cb, dtype=torch.float32, device=device))
        return self._codebooks[key]

    def _process_model_before_weight_loading(self, model: nn.Module, **kwargs: Any) -> None:
        qc = self.quantization_config
        skip = _resolved_skips(self, model, qc.modules_to_not_convert)
        head = _quantized_lm_head(model, qc.modules_to_not_convert) if qc.lm_head else None
        if head is not None:  # transformers' default skips name it (output embeddings, last module)
            skip = [s for s in skip if s != head]
        qc.modules_to_not_convert = skip
        dtype = self.dtype or model.dtype
        targets = _linears_to_convert(model, skip)
        for name, lin in targets:
            check_kbit_shape(name, lin.in_features, lin.out_features, qc.blocksize)
        if self.pre_quantized:
            self._check_checkpoint(targets, kwargs.get("checkpoint_files"))
        for name, lin in targets:
            with torch.device("meta"):
                new = KbitLinear(lin.in_features, lin.out_features, lin.bias is not None, qc.bits, dtype,
                                 quantize_on_load=not self.pre_quantized, layer_name=name)
            model.set_submodule(name, new)
        experts = _experts_to_convert(model, skip)
        for name, mod, (n_exp, hidden, inter) in experts:
            with torch.device("meta"):
                new = KbitExperts(n_exp, hidden, inter, qc.bits, mod.act_fn, dtype,
                                  quantize_on_load=not self.pre_quantized, layer_name=name)
            model.set_submodule(name, new)
        logger.info("kbit: %s %d linear layers and %d MoE expert modules at %d bits (skipped: %s)",
                    "loading" if self.pre_quantized else "quantizing", len(targets), len(experts), qc.bits, skip)
        _log_experts_left(model, "kbit", skip)

    def _check_checkpoint(self, targets: list[tuple[str, nn.Linear]], checkpoint_files: list[str] | None) -> None:
        """Dtypes and shapes of each layer's kbit tensors (headers), and finite codebooks, before loading."""
        index = _checkpoint_index(checkpoint_files)
        if not index:
            return
        k = self.quantization_config.bits
        for name, lin in targets:
            nb = lin.in_features // 32
            pname = f"{name}.weight_packed"
            hint = f" for bits={k}"
            if pname in index and index[pname][1][-1] % nb == 0 and index[pname][1][-1] // nb != k:
                hint += f" (the tensor holds bits={index[pname][1][-1] // nb}; the config's bits disagree)"
            check_checkpoint_tensor(index, pname, (torch.int32,), [lin.out_features, nb * k], "kbit", hint)
            check_checkpoint_tensor(index, f"{name}.weight_absmax", (torch.uint8,), [lin.out_features, nb], "kbit")
            cname = f"{name}.codebook"
            check_checkpoint_tensor(index, cname, (torch.float16, torch.bfloat16, torch.float32), [1 << k], "kbit",
                                    hint)
            if cname in index:
                from safetensors import safe_open

                with safe_open(index[cname][2], framework="pt") as fh:
                    _finite_or_raise(fh.get_tensor(cname), cname, "kbit")

    def update_weight_conversions(self, weight_conversions: list[Any], model: nn.Module | None = None) -> list[Any]:
        """Also merge saved per-expert ``weight_packed`` / ``weight_absmax`` into the stacked experts.

        (``model`` is absent in transformers 5.17's signature; the base method is not called because
        5.17 and 5.23 differ, and kbit needs none of its serialized-name machinery.)
        """
        return list(weight_conversions) + _companion_expert_converters(weight_conversions, set(EXPERT_PROJS),
                                                                       KBIT_EXPERT_COMPANIONS)

    def param_needs_quantization(self, model: nn.Module, param_name: str, **kwargs: Any) -> bool:
        if self.pre_quantized:
            return False
        module, name = get_module_from_name(model, param_name)
        return ((isinstance(module, KbitLinear) and name == "weight")
                or (isinstance(module, KbitExperts) and name in EXPERT_PROJS))

    def get_quantize_ops(self) -> ConversionOps:
        return KbitQuantizeOp(self)

    def param_element_size(self, model: nn.Module, param_name: str, param: torch.Tensor) -> float:
        """Bytes per weight for device_map planning: k/8 for codes + 1/32 for the E4M4 absmax."""
        if self.param_needs_quantization(model, param_name):
            return self.quantization_config.bits / 8 + 1 / 32
        return param.element_size()

    def _process_model_after_weight_loading(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        layers = [(n, m) for n, m in model.named_modules() if isinstance(m, KbitLinear)]
        for name, m in _progress(layers, "kbit repack"):
            missing = [t for t in KBIT_SERIALIZED if not _loaded(getattr(m, t))]
            if missing:
                raise ValueError(f"kbit: layer '{name}' is missing {missing} in the checkpoint (expected "
                                 f"weight_packed int32 [{m.out_features}, {m.in_features // 32 * m.bits}], "
                                 f"weight_absmax uint8 [{m.out_features}, {m.in_features // 32}], "
                                 f"codebook fp32 [{1 << m.bits}])")
            _finite_or_raise(m.codebook, f"{name}.codebook", "kbit")
            try:
                m.repack_()
            except ValueError as e:
                raise ValueError(f"kbit: layer '{name}': {e}") from e
        for name, m in [(n, m) for n, m in model.named_modules() if isinstance(m, KbitExperts)]:
            missing = [p + s for p in EXPERT_PROJS for s in KBIT_EXPERT_SUFFIXES if not _loaded(getattr(m, p + s))]
            if missing:
                raise ValueError(f"kbit: MoE experts '{name}' are missing {missing} in the checkpoint (expected "
                                 f"gate_up_proj_packed int32 [{m.num_experts}, {2 * m.intermediate_dim}, "
                                 f"{m.hidden_dim // 32 * m.bits}] and the like, or per-expert "
                                 "'experts.<e>.<proj>.weight_packed' / 'weight_absmax' tensors)")
            m.repack_(self.codebook(m.gate_up_proj_packed.device))
        _keep_expert_converters(model, KBIT_EXPERT_COMPANIONS)
        if not self.pre_quantized:
            logger.info("kbit: quantized %d linear / expert weights to %d bits", self.n_quantized,
                        self.quantization_config.bits)
        return model

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        return True


class AwqOrinHfQuantizer(_WeightOnlyQuantizer):
    """Runs AutoAWQ "gemm" checkpoints on kbit_vllm's awq ops (see AwqOrinConfig for how to select it)."""

    METHOD = "awq_orin"
    DEFAULT_DTYPE = torch.float16
    requires_calibration = True
    quantization_config: AwqOrinConfig

    def __init__(self, quantization_config: AwqOrinConfig, **kwargs: Any) -> None:
        if not kwargs.get("pre_quantized", True):
            raise ValueError("awq_orin serves existing AutoAWQ checkpoints and cannot quantize a float model; "
                             "use KbitConfig to quantize while loading")
        super().__init__(quantization_config, **kwargs)

    def _process_model_before_weight_loading(self, model: nn.Module, **kwargs: Any) -> None:
        qc = self.quantization_config
        skip = _resolved_skips(self, model, qc.modules_to_not_convert)
        dtype = self.dtype or model.dtype
        targets = _linears_to_convert(model, skip)
        index = _checkpoint_index(kwargs.get("checkpoint_files"))
        scales_dtype = _awq_scales_dtype(index)
        g = qc.group_size
        for name, lin in targets:
            if lin.in_features % g or lin.out_features % 8:
                continue  # AwqOrinLinear names the layer below
            groups, packs = lin.in_features // g, lin.out_features // 8
            check_checkpoint_tensor(index, f"{name}.qweight", (torch.int32,), [lin.in_features, packs], "awq_orin")
            check_checkpoint_tensor(index, f"{name}.qzeros", (torch.int32,), [groups, packs], "awq_orin")
            check_checkpoint_tensor(index, f"{name}.scales", _FLOAT_DTYPES, [groups, lin.out_features], "awq_orin")
        for name, lin in targets:
            with torch.device("meta"):
                new = AwqOrinLinear(lin.in_features, lin.out_features, lin.bias is not None, qc.group_size, dtype,
                                    layer_name=name, scales_dtype=scales_dtype)
            model.set_submodule(name, new)
        experts = _experts_to_convert(model, skip)
        for name, mod, (n_exp, hidden, inter) in experts:
            with torch.device("meta"):
                new = AwqOrinExperts(n_exp, hidden, inter, g, mod.act_fn, scales_dtype, layer_name=name)
            model.set_submodule(name, new)
        _check_awq_expert_checkpoint(self, model, index)
        logger.info("awq_orin: loading %d AWQ int4 linear layers and %d MoE expert modules (group %d)",
                    len(targets), len(experts), g)
        _log_experts_left(model, "awq_orin", skip)

    def update_weight_conversions(self, weight_conversions: list[Any], model: nn.Module | None = None) -> list[Any]:
        """Also merge the checkpoint's per-expert ``qweight`` / ``qzeros`` / ``scales`` into AwqOrinExperts'
        stacked params (as KbitHfQuantizer does for its companions)."""
        return list(weight_conversions) + _companion_expert_converters(weight_conversions, set(EXPERT_PROJS),
                                                                       AWQ_EXPERT_COMPANIONS, in_out=True)

    def _process_model_after_weight_loading(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        dtype = self.dtype or model.dtype
        layers = [(n, m) for n, m in model.named_modules() if isinstance(m, AwqOrinLinear)]
        for name, m in _progress(layers, "awq_orin repack"):
            missing = [t for t in ("qweight", "qzeros", "scales") if not _loaded(getattr(m, t))]
            if missing:
                raise ValueError(f"awq_orin: layer '{name}' is missing {missing} in the checkpoint; if it is "
                                 "not AWQ-quantized, list it in modules_to_not_convert")
            _finite_or_raise(m.scales.data, f"{name}.scales", "awq_orin")
            m.repack_(dtype)
        for name, m in [(n, m) for n, m in model.named_modules() if isinstance(m, AwqOrinExperts)]:
            missing = [p + s for p in EXPERT_PROJS for s in AWQ_EXPERT_SUFFIXES if not _loaded(getattr(m, p + s))]
            if missing:
                raise ValueError(f"awq_orin: MoE experts '{name}' are missing {missing} in the checkpoint (expected "
                                 "AutoAWQ per-expert 'experts.<e>.<proj>.qweight' / 'qzeros' / 'scales' tensors); "
                                 "if they are not AWQ-quantized, list them in modules_to_not_convert")
            m.repack_(dtype)
        _keep_expert_converters(model, AWQ_EXPERT_COMPANIONS, in_out=True)
        return model

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        """Layers save the AutoAWQ tensors they loaded (read back from the resident layout)."""
        return True


def _install_awq_override() -> None:
    """Let ``from_pretrained(awq_checkpoint, quantization_config=AwqOrinConfig())`` select awq_orin.

    transformers raises when the passed config class differs from the checkpoint's. This wrapper
    changes only that case (an AwqOrinConfig passed for an "awq" checkpoint); every other call
    goes to the original method unchanged.
    """
    cls = hf_auto.AutoHfQuantizer
    if getattr(cls.merge_quantization_configs, "_kbit_vllm_wrapped", False):
        return
    original = cls.merge_quantization_configs.__func__

    def merge(klass: type, quantization_config: Any, quantization_config_from_args: Any) -> Any:
        if isinstance(quantization_config_from_args, AwqOrinConfig):
            qc = quantization_config if isinstance(quantization_config, dict) else quantization_config.to_dict()
            if qc.get("quant_method") in ("awq", "awq_orin"):
                return AwqOrinConfig.from_checkpoint_config(qc, quantization_config_from_args)
        return original(klass, quantization_config, quantization_config_from_args)

    merge._kbit_vllm_wrapped = True  # type: ignore[attr-defined]
    cls.merge_quantization_configs = classmethod(merge)


def register_hf() -> None:
    """Register kbit and awq_orin with transformers (idempotent; a second import is a no-op)."""
    for name, config_cls, quantizer_cls in (("kbit", KbitConfig, KbitHfQuantizer),
                                            ("awq_orin", AwqOrinConfig, AwqOrinHfQuantizer)):
        if name not in hf_auto.AUTO_QUANTIZATION_CONFIG_MAPPING:
            hf_auto.register_quantization_config(name)(config_cls)
        if name not in hf_auto.AUTO_QUANTIZER_MAPPING:
            hf_auto.register_quantizer(name)(quantizer_cls)
    _install_awq_override()


register_hf()
