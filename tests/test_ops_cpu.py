"""The kbit_vllm:: ops on CPU against a float64 reference, their input checks, and torch.compile."""

from __future__ import annotations

import pytest
import torch

import kbit_vllm  # noqa: F401  (registers the op implementations)
from kbit_vllm import ops
from kbit_vllm.backends.cpu import int4pack
from kbit_vllm.formats import (
    decode_e4m4,
    normal_float_codebook,
    pack_awq,
    quantize_awq_rtn,
    unpack_awq,
    unpack_codes,
)

BITS = (2, 3, 4, 5)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Relative (max-norm) error of y against the float64 product of the same dequantized weights:
# only the activation dtype's rounding remains (accumulation length <= 512).
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _w64(packed: torch.Tensor, absmax: torch.Tensor, cb: torch.Tensor, k: int) -> torch.Tensor:
    """Independent float64 dequantization straight from the bits (not via formats.dequantize_kbit)."""
    codes = unpack_codes(packed, k).long()
    scale = decode_e4m4(absmax).double().repeat_interleave(32, dim=1)
    return cb.double()[codes] * scale


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("k", BITS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_dequantize(k: int, dtype: torch.dtype, gen: torch.Generator) -> None:
    w = torch.randn(96, 160, generator=gen).to(dtype)
    cb = normal_float_codebook(k)
    packed, absmax = ops.kbit_quantize(w, cb, k)
    assert packed.dtype == torch.int32 and packed.shape == (96, 5 * k)
    assert absmax.dtype == torch.uint8 and absmax.shape == (96, 5)
    out = ops.kbit_dequantize(packed, absmax, cb, k, dtype)
    assert out.dtype == dtype and out.shape == w.shape
    assert torch.equal(out, _w64(packed, absmax, cb, k).to(dtype))


@pytest.mark.parametrize("k", BITS)
def test_repack_unrepack_ops(k: int, gen: torch.Generator) -> None:
    w = torch.randn(200, 64, generator=gen)
    packed, absmax = ops.kbit_quantize(w, normal_float_codebook(k), k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    p2, a2 = ops.kbit_unrepack(pt, at, k, 200)
    assert torch.equal(p2, packed) and torch.equal(a2, absmax)


@pytest.mark.parametrize("k", BITS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", [(1,), (3,), (2, 5), (17,)])
def test_kbit_linear(k: int, dtype: torch.dtype, lead: tuple[int, ...], gen: torch.Generator) -> None:
    out_f, in_f = 200, 96  # out not a multiple of the 128-row tile
    w = torch.randn(out_f, in_f, generator=gen)
    cb = normal_float_codebook(k)
    packed, absmax = ops.kbit_quantize(w, cb, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    x = torch.randn(*lead, in_f, generator=gen).to(dtype)
    bias = torch.randn(out_f, generator=gen).to(dtype)
    y = ops.kbit_linear(x, pt, at, cb, bias, k, out_f)
    assert y.shape == (*lead, out_f) and y.dtype == dtype
    ref = x.double() @ _w64(packed, absmax, cb, k).t() + bias.double()
    assert _rel(y, ref) < TOL[dtype]
    y_nb = ops.kbit_linear(x, pt, at, cb, None, k, out_f)
    assert _rel(y_nb, ref - bias.double()) < TOL[dtype]


@pytest.mark.parametrize("k", (2, 4))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_kbit_grouped_linear(k: int, dtype: torch.dtype, gen: torch.Generator) -> None:
    n_exp, out_f, in_f = 4, 64, 64
    cb = normal_float_codebook(k)
    tokens = [3, 0, 5, 1]  # uneven, one expert without tokens
    offsets = torch.tensor([0, *torch.tensor(tokens).cumsum(0).tolist()], dtype=torch.int32)
    w = torch.randn(n_exp, out_f, in_f, generator=gen)
    ser = [ops.kbit_quantize(w[e], cb, k) for e in range(n_exp)]
    tiled = [ops.kbit_repack(p, a, k) for p, a in ser]
    pt = torch.stack([t[0] for t in tiled])
    at = torch.stack([t[1] for t in tiled])
    x = torch.randn(sum(tokens), in_f, generator=gen).to(dtype)
    y = ops.kbit_grouped_linear(x, pt, at, cb, offsets, k, out_f)
    assert y.shape == (sum(tokens), out_f)
    for e in range(n_exp):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi > lo:
            ref = x[lo:hi].double() @ _w64(*ser[e], cb, k).t()
            assert _rel(y[lo:hi], ref) < TOL[dtype]
    with pytest.raises(ValueError, match="expert_offsets must rise"):
        ops.kbit_grouped_linear(x, pt, at, cb, torch.tensor([0, 5, 2, 8, 9], dtype=torch.int32), k, out_f)


def _awq_w64(qw: torch.Tensor, qz: torch.Tensor, s: torch.Tensor, gs: int) -> torch.Tensor:
    q = unpack_awq(qw).double()
    z = unpack_awq(qz).double().repeat_interleave(gs, dim=0)
    return ((q - z) * s.double().repeat_interleave(gs, dim=0)).t()


@pytest.mark.parametrize("gs", [32, 64, 128])
def test_awq_dequantize(gs: int, gen: torch.Generator) -> None:
    qw, qz, s = quantize_awq_rtn(torch.randn(48, 384, generator=gen), gs)
    w = ops.awq_dequantize(qw, qz, s, gs)
    assert w.shape == (48, 384) and w.dtype == torch.float16
    assert _rel(w, _awq_w64(qw, qz, s, gs)) < 1e-3


@pytest.mark.parametrize("gs", [32, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_f", [64, 40])  # 40: int4pack cannot take it -> dequant + matmul
def test_awq_linear(gs: int, dtype: torch.dtype, out_f: int, gen: torch.Generator) -> None:
    in_f = 3 * 128  # odd number of groups for gs=128
    qw, qz, s = quantize_awq_rtn(torch.randn(out_f, in_f, generator=gen), gs)
    wq, sz = ops.awq_repack(qw, qz, s, gs, dtype)
    fused = int4pack.supports(in_f, out_f, gs)
    assert fused == (out_f % 16 == 0)
    assert wq.dtype == (torch.uint8 if fused else torch.int32) and sz.shape == (in_f // gs, out_f, 2)
    x = torch.randn(2, 3, in_f, generator=gen).to(dtype)
    bias = torch.randn(out_f, generator=gen).to(dtype)
    y = ops.awq_linear(x, wq, sz, bias, gs, out_f)
    assert y.shape == (2, 3, out_f) and y.dtype == dtype
    ref = x.double() @ _awq_w64(qw, qz, s, gs).t() + bias.double()
    # scale/offset are rounded to the activation dtype once more in the resident layout
    assert _rel(y, ref) < 2 * TOL[dtype] + (2e-3 if dtype != torch.float32 else 2e-4)


@pytest.mark.parametrize(("out_f", "in_f"), [(64, 384), (208, 128), (40, 64)])  # 40: wq stays the qweight
def test_awq_unrepack_reads_qweight_back(out_f: int, in_f: int, gen: torch.Generator) -> None:
    """Every resident layout (this CPU's int4pack tile order, the reference, the CUDA transpose) gives the
    AutoAWQ qweight back bit-exactly, so a loaded model can be saved."""
    from kbit_vllm.backends import reference
    from kbit_vllm.backends.cuda import awq_ops

    qw, qz, s = quantize_awq_rtn(torch.randn(out_f, in_f, generator=gen), 32)
    for repack, unrepack in ((ops.awq_repack, ops.awq_unrepack), (reference.awq_repack, reference.awq_unrepack),
                             (awq_ops.awq_repack, awq_ops.awq_unrepack)):
        wq, _ = repack(qw, qz, s, 32, torch.bfloat16)
        back = unrepack(wq, in_f, out_f)
        assert back.dtype == torch.int32 and torch.equal(back, qw)
    with pytest.raises(ValueError, match=r"awq_unrepack: .*must be"):
        ops.awq_unrepack(ops.awq_repack(qw, qz, s, 32, torch.float32)[0], in_f, out_f + 8)


def test_torch_compile_fullgraph(gen: torch.Generator) -> None:
    k, out_f, in_f = 3, 130, 64
    cb = normal_float_codebook(k)
    pt, at = ops.kbit_repack(*ops.kbit_quantize(torch.randn(out_f, in_f, generator=gen), cb, k), k)
    qw, qz, s = quantize_awq_rtn(torch.randn(64, 128, generator=gen), 64)
    wq, sz = ops.awq_repack(qw, qz, s, 64, torch.float32)

    def f(x: torch.Tensor) -> torch.Tensor:
        h = ops.kbit_linear(x, pt, at, cb, None, k, out_f)[..., :128]
        return ops.awq_linear(torch.relu(h), wq, sz, None, 64, 64)

    x = torch.randn(4, in_f, generator=gen)
    compiled = torch.compile(f, fullgraph=True)
    assert torch.allclose(compiled(x), f(x))


def test_fake_shapes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        cb = torch.empty(16)
        p, a = ops.kbit_quantize(torch.empty(300, 64), cb, 4)
        assert p.shape == (300, 8) and a.shape == (300, 2)
        pt, at = ops.kbit_repack(p, a, 4)
        assert pt.shape == (3, 2, 4, 128) and at.shape == (3, 2, 128)
        assert ops.kbit_linear(torch.empty(2, 7, 64), pt, at, cb, None, 4, 300).shape == (2, 7, 300)
        with pytest.raises(ValueError, match="x must be"):
            ops.kbit_linear(torch.empty(2, 65), pt, at, cb, None, 4, 300)


# --- bad inputs -------------------------------------------------------------------------------

def test_bad_inputs_raise(gen: torch.Generator) -> None:
    cb4 = normal_float_codebook(4)
    w = torch.randn(64, 64, generator=gen)
    with pytest.raises(ValueError, match="bits must be one of"):
        ops.kbit_quantize(w, cb4, 6)
    with pytest.raises(ValueError, match=r"codebook for bits=3 must have shape \[8\]"):
        ops.kbit_quantize(w, cb4, 3)
    with pytest.raises(ValueError, match="codebook must be torch.float32"):
        ops.kbit_quantize(w, cb4.double(), 4)
    with pytest.raises(ValueError, match="in_features must be a multiple of 32"):
        ops.kbit_quantize(torch.randn(64, 48), cb4, 4)
    with pytest.raises(ValueError, match="weight must be"):
        ops.kbit_quantize(w.to(torch.int32), cb4, 4)
    packed, absmax = ops.kbit_quantize(w, cb4, 4)
    with pytest.raises(ValueError, match=r"packed must be \[out, in/32\*k\]"):
        ops.kbit_dequantize(packed[:, :4], absmax, cb4, 4)
    with pytest.raises(ValueError, match="absmax must be torch.uint8"):
        ops.kbit_repack(packed, absmax.to(torch.int32), 4)
    pt, at = ops.kbit_repack(packed, absmax, 4)
    with pytest.raises(ValueError, match="absmax_tiled must be"):
        ops.kbit_linear(torch.randn(2, 64), pt, at, cb4, None, 4, 200)
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 64\]"):
        ops.kbit_linear(torch.randn(2, 32), pt, at, cb4, None, 4, 64)
    with pytest.raises(ValueError, match="bias dtype"):
        ops.kbit_linear(torch.randn(2, 64), pt, at, cb4, torch.zeros(64, dtype=torch.float16), 4, 64)
    with pytest.raises(ValueError, match="x must be torch"):
        ops.kbit_linear(torch.ones(2, 64, dtype=torch.int64), pt, at, cb4, None, 4, 64)
    qw, qz, s = quantize_awq_rtn(torch.randn(64, 128, generator=gen), 64)
    with pytest.raises(ValueError, match="group_size must be one of"):
        ops.awq_dequantize(qw, qz, s, 16)
    with pytest.raises(ValueError, match=r"scales must be \[in/group_size, out\]"):
        ops.awq_dequantize(qw, qz, s[:1], 64)
    with pytest.raises(ValueError, match=r"qzeros must be"):
        ops.awq_repack(qw, pack_awq(torch.zeros(1, 64, dtype=torch.uint8)), s, 64, torch.float32)
    wq, sz = ops.awq_repack(qw, qz, s, 64, torch.float16)
    with pytest.raises(ValueError, match="must match x dtype"):
        ops.awq_linear(torch.randn(2, 128), wq, sz, None, 64, 64)


def test_library_status_reports() -> None:
    st = kbit_vllm.cuda_library_status()
    assert isinstance(st, kbit_vllm.LibraryStatus)
    if st.loaded:
        assert st.path and st.archs and all(a.startswith("sm_") for a in st.archs)
        assert "loaded" in str(st)
    else:
        assert st.reason and "not loaded" in str(st)


def test_cli_roundtrip(capsys: pytest.CaptureFixture[str]) -> None:
    from kbit_vllm.cli import main

    assert main(["roundtrip", "--rows", "128", "--cols", "256"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    sqnr = {int(r[0]): float(r[2]) for r in rows if len(r) == 4}
    assert sorted(sqnr) == [2, 3, 4, 5] and sqnr[2] < sqnr[3] < sqnr[4] < sqnr[5]
    assert main(["info"]) == 0
