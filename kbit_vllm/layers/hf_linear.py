"""Hugging Face nn.Module replacements for nn.Linear: KbitLinear and AwqOrinLinear.

Each module goes through two states:

* loading: it holds placeholders whose names, shapes and dtypes equal the serialized tensors,
  so transformers' loader assigns checkpoint tensors (or the on-the-fly quantize op's outputs)
  by key, with no converter;
* resident: after loading, ``repack_()`` turns them into the layout the kernels read, once,
  and frees the serialized copy (one copy of the weights in memory).

A resident layer still saves the serialized format: ``_save_to_state_dict`` unrepacks on the
fly, so ``save_pretrained`` writes portable tensors the vLLM loader reads (kbit) or the
AutoAWQ checkpoint's own tensors (awq_orin).
They call only kbit_vllm.ops.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import ops
from ..formats import BLOCK, SUPPORTED_BITS

KBIT_SERIALIZED = ("weight_packed", "weight_absmax", "codebook")


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def check_kbit_shape(name: str, in_features: int, out_features: int, blocksize: int = BLOCK) -> None:
    """Raise a ValueError naming the layer when kbit cannot quantize its shape."""
    if in_features % blocksize != 0:
        raise ValueError(
            f"kbit: layer '{name}' has in_features={in_features}, which is not a multiple of the "
            f"blocksize {blocksize}; add '{name}' to KbitConfig(modules_to_not_convert=[...]) to keep it "
            "unquantized"
        )
    if out_features <= 0:
        raise ValueError(f"kbit: layer '{name}' has out_features={out_features}")


class KbitLinear(nn.Module):
    """y = x @ W^T + b with W stored as k-bit codebook blocks (kbit_vllm::kbit_linear).

    Not an nn.Linear subclass, so model ``_init_weights`` code and ``isinstance(m, nn.Linear)``
    checks leave it alone. Serialized tensors (also the load placeholders):
    ``weight_packed`` int32 [out, in/32*k], ``weight_absmax`` uint8 [out, in/32],
    ``codebook`` fp32 [2^k] (persistent buffer), ``bias`` [out] if any.
    With ``quantize_on_load`` a float ``weight`` [out, in] placeholder receives the checkpoint
    weight for the quantize op (it must be float: transformers 5.17 casts to the placeholder
    dtype before the op); it is dropped by ``repack_()``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, bits: int,
                 dtype: torch.dtype = torch.bfloat16, quantize_on_load: bool = False,
                 layer_name: str = "") -> None:
        super().__init__()
        if bits not in SUPPORTED_BITS:
            raise ValueError(f"kbit: bits must be one of {SUPPORTED_BITS}, got {bits!r}")
        check_kbit_shape(layer_name or "<unnamed>", in_features, out_features)
        self.in_features = in_features
        self.out_features = out_features
        self.bits = bits
        self.layer_name = layer_name
        self.tiled = False
        nb = in_features // BLOCK
        if quantize_on_load:
            self.weight = _frozen(torch.empty(out_features, in_features, dtype=dtype))
        self.weight_packed = _frozen(torch.empty(out_features, nb * bits, dtype=torch.int32))
        self.weight_absmax = _frozen(torch.empty(out_features, nb, dtype=torch.uint8))
        self.register_buffer("codebook", torch.empty(1 << bits, dtype=torch.float32), persistent=True)
        self.bias = _frozen(torch.empty(out_features, dtype=dtype)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int, codebook: torch.Tensor, name: str = "") -> KbitLinear:
        """Quantize an existing nn.Linear (outside from_pretrained); returns a resident module."""
        w = linear.weight.detach()
        with torch.device("meta"):
            m = cls(linear.in_features, linear.out_features, linear.bias is not None, bits, w.dtype, layer_name=name)
        packed, absmax = ops.kbit_quantize(w, codebook.to(w.device, torch.float32), bits)
        m.weight_packed, m.weight_absmax = _frozen(packed), _frozen(absmax)
        m.codebook = codebook.to(w.device, torch.float32).clone()
        if linear.bias is not None:
            m.bias = _frozen(linear.bias.detach().clone())
        m.repack_()
        return m

    def repack_(self) -> None:
        """Serialized -> resident tiled layout (kbit_repack), replacing the serialized tensors."""
        if self.tiled:
            return
        if "weight" in self._parameters:
            del self._parameters["weight"]
        packed_t, absmax_t = ops.kbit_repack(self.weight_packed.data, self.weight_absmax.data, self.bits)
        self.weight_packed = _frozen(packed_t)
        self.weight_absmax = _frozen(absmax_t)
        self.tiled = True

    def serialized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed [out, in/32*k], absmax [out, in/32]) whatever the current layout."""
        if not self.tiled:
            return self.weight_packed.data, self.weight_absmax.data
        return ops.kbit_unrepack(self.weight_packed.data, self.weight_absmax.data, self.bits, self.out_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dense W [out, in] (for tests, debugging and dequantize-to-dense)."""
        packed, absmax = self.serialized()
        return ops.kbit_dequantize(packed, absmax, self.codebook.float(), self.bits, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.tiled:
            raise RuntimeError(f"KbitLinear '{self.layer_name}': weights not repacked yet (call repack_())")
        cb = self.codebook if self.codebook.dtype == torch.float32 else self.codebook.float()
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        return ops.kbit_linear(x, self.weight_packed, self.weight_absmax, cb, bias, self.bits, self.out_features)

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        """Always save the serialized (portable, TP-shardable) format, never the tiled one."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.tiled:
            packed, absmax = self.serialized()
            destination[prefix + "weight_packed"] = packed
            destination[prefix + "weight_absmax"] = absmax

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Accept serialized tensors in load_state_dict while resident (repacks them)."""
        kp, ka = prefix + "weight_packed", prefix + "weight_absmax"
        if self.tiled and kp in state_dict and ka in state_dict and state_dict[ka].dim() == 2:
            state_dict[kp], state_dict[ka] = ops.kbit_repack(state_dict[kp], state_dict[ka], self.bits)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"bias={self.bias is not None}, tiled={self.tiled}")


class AwqOrinLinear(nn.Module):
    """y = x @ W^T + b for an AutoAWQ "gemm" int4 layer, on kbit_vllm::awq_linear.

    Load placeholders match AutoAWQ checkpoints: ``qweight`` int32 [in, out/8], ``qzeros`` int32
    [in/g, out/8], ``scales`` [in/g, out] in ``scales_dtype`` (the checkpoint's, so they load and
    save unchanged), ``bias``. ``repack_(dtype)`` builds the device's resident layout (``wq``,
    ``sz`` in the activation dtype; non-persistent buffers) and drops ``qweight``; the state dict
    (what save_pretrained writes) reads it back from ``wq`` with awq_unrepack, so a resident
    layer still saves the AutoAWQ tensors bit-exactly.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, group_size: int,
                 dtype: torch.dtype = torch.float16, layer_name: str = "",
                 scales_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if in_features % group_size != 0 or out_features % 8 != 0:
            raise ValueError(
                f"awq_orin: layer '{layer_name}' [{out_features}x{in_features}] needs in_features % "
                f"group_size ({group_size}) == 0 and out_features % 8 == 0; add it to modules_to_not_convert"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.group_size = group_size
        self.layer_name = layer_name
        self.resident = False
        g = in_features // group_size
        self.qweight = _frozen(torch.empty(in_features, out_features // 8, dtype=torch.int32))
        self.qzeros = _frozen(torch.empty(g, out_features // 8, dtype=torch.int32))
        self.scales = _frozen(torch.empty(g, out_features, dtype=scales_dtype))
        self.bias = _frozen(torch.empty(out_features, dtype=dtype)) if bias else None

    def repack_(self, dtype: torch.dtype) -> None:
        """AWQ tensors -> resident layout (awq_repack) in activation dtype, freeing qweight."""
        if self.resident:
            return
        wq, sz = ops.awq_repack(self.qweight.data, self.qzeros.data, self.scales.data, self.group_size, dtype)
        del self._parameters["qweight"]
        self.register_buffer("wq", wq, persistent=False)
        self.register_buffer("sz", sz, persistent=False)
        if self.bias is not None:
            self.bias = _frozen(self.bias.data.to(dtype))
        self.resident = True

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        """The AutoAWQ tensors, whatever the layout."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.resident:
            destination[prefix + "qweight"] = ops.awq_unrepack(self.wq, self.in_features, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.resident:
            raise RuntimeError(f"AwqOrinLinear '{self.layer_name}': weights not repacked yet (call repack_())")
        sz, bias = self.sz, self.bias
        if sz.dtype != x.dtype:  # e.g. the model was cast after loading
            sz = sz.to(x.dtype)
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        return ops.awq_linear(x, self.wq, sz, bias, self.group_size, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, bias={self.bias is not None}, resident={self.resident}")
