"""Format properties: codebooks, E4M4, bit planes, tiled layout, error budget, AWQ packing."""

from __future__ import annotations

import math

import pytest
import torch

from kbit_vllm.formats import (
    AWQ_ORDER,
    E4M4_MAX,
    decode_e4m4,
    dequantize_awq,
    dequantize_kbit,
    encode_e4m4,
    from_tiled,
    normal_float_codebook,
    pack_awq,
    pack_bitplanes,
    quantize_awq_rtn,
    quantize_kbit,
    to_tiled,
    unpack_awq,
    unpack_bitplanes,
)
from kbit_vllm.formats.bitplanes import pack_bitplanes_shifts
from kbit_vllm.formats.kbit_layout import TILE_N, tiled_bit_position, tiled_word

BITS = (2, 3, 4, 5)


# --- codebooks --------------------------------------------------------------------------------

@pytest.mark.parametrize("k", BITS)
def test_codebook_properties(k: int) -> None:
    cb = normal_float_codebook(k)
    assert cb.dtype == torch.float32 and cb.shape == (1 << k,)
    assert torch.all(cb[1:] > cb[:-1]), "sorted, distinct"
    assert cb.abs().max().item() == 1.0
    assert torch.allclose(cb, -cb.flip(0), atol=1e-6), "symmetric around 0"
    # Levels are conditional means of N(0,1) in equiprobable bins: their mean is ~0 and the
    # outermost level sits inside the last bin, above the last finite bin edge.
    assert abs(cb.mean().item()) < 1e-6


def test_codebook_values_k2() -> None:
    # k=2 by hand: bins split at Phi^-1(1/4), 0, Phi^-1(3/4); E[X | X > q75] = 4 phi(q75).
    q = 0.6744897501960817
    outer = 4 * math.exp(-q * q / 2) / math.sqrt(2 * math.pi)
    inner = 4 * (1 / math.sqrt(2 * math.pi) - math.exp(-q * q / 2) / math.sqrt(2 * math.pi))
    expect = torch.tensor([-1, -inner / outer, inner / outer, 1], dtype=torch.float32)
    assert torch.allclose(normal_float_codebook(2), expect, atol=1e-6)


def test_codebook_cached_per_device() -> None:
    assert normal_float_codebook(4) is normal_float_codebook(4)
    assert normal_float_codebook(4) is normal_float_codebook(4, "cpu")
    assert normal_float_codebook(3) is not normal_float_codebook(4)


@pytest.mark.parametrize("k", [1, 6, 0, 4.0, True])
def test_codebook_bad_bits(k) -> None:
    with pytest.raises(ValueError, match="bits must be one of"):
        normal_float_codebook(k)


# --- E4M4 ----------------------------------------------------------------------------------------

def test_e4m4_round_trip_all_codes() -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(encode_e4m4(decode_e4m4(codes)), codes)


def test_e4m4_monotone_distinct() -> None:
    vals = decode_e4m4(torch.arange(256, dtype=torch.uint8))
    assert torch.all(vals[1:] > vals[:-1])
    assert len(set(vals.tolist())) == 256
    assert vals[255].item() == E4M4_MAX == 31.0


def test_e4m4_normal_and_subnormal_values() -> None:
    d = lambda c: decode_e4m4(torch.tensor([c], dtype=torch.uint8)).item()  # noqa: E731
    assert d(0) == 0.0
    assert d(0x01) == 2.0**-10 / 16  # smallest subnormal
    assert d(0x0F) == 2.0**-10 * 15 / 16  # largest subnormal
    assert d(0x10) == 2.0**-10  # smallest normal
    assert d(0xB0) == 1.0  # e = 11 (the bias), m = 0
    assert d(0xB8) == 1.5
    # subnormals round to nearest as well
    x = torch.tensor([2.0**-10 * 5.4 / 16, 2.0**-10 * 5.6 / 16])
    assert encode_e4m4(x).tolist() == [5, 6]


def test_e4m4_encode_nearest(gen: torch.Generator) -> None:
    v = torch.rand(100_000, generator=gen) * 31
    code = encode_e4m4(v)
    table = decode_e4m4(torch.arange(256, dtype=torch.uint8))
    err = (decode_e4m4(code) - v).abs()
    best = (table.unsqueeze(0) - v.unsqueeze(1)).abs().amin(dim=1)
    assert torch.equal(err, best)
    # relative error at most half a mantissa step (1/32) in the normal range
    normal = v > 2.0**-10
    assert ((err / v)[normal] <= 1 / 32 + 1e-7).all()


def test_e4m4_rejects_negative() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        encode_e4m4(torch.tensor([-1.0]))


# --- bit planes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("k", BITS)
def test_bitplanes_round_trip(k: int, gen: torch.Generator) -> None:
    codes = torch.randint(0, 1 << k, (7, 5, 32), generator=gen, dtype=torch.uint8)
    words = pack_bitplanes(codes, k)
    assert words.dtype == torch.int32 and words.shape == (7, 5, k)
    assert torch.equal(unpack_bitplanes(words, k), codes)


@pytest.mark.parametrize("k", BITS)
def test_bitplanes_pack_is_the_definition(k: int, gen: torch.Generator) -> None:
    """The multiply-gather packing equals the shift-per-bit one on random codes, all-ones included."""
    codes = torch.randint(0, 1 << k, (3, 300, 32), generator=gen, dtype=torch.uint8)
    codes[0, 0] = (1 << k) - 1
    for dtype in (torch.uint8, torch.int64):
        assert torch.equal(pack_bitplanes(codes.to(dtype), k), pack_bitplanes_shifts(codes, k))


def test_bitplanes_hand_example() -> None:
    codes = torch.zeros(32, dtype=torch.uint8)
    codes[0] = 0b01
    codes[31] = 0b11
    words = pack_bitplanes(codes, 2)
    assert words.tolist() == [1 - 2**31, -(2**31)]  # bit 0 of word 0 and bit 31 of both words


# --- kbit quantize / dequantize / layout --------------------------------------------------------

def _sqnr_db(w: torch.Tensor, wq: torch.Tensor) -> float:
    return 10 * math.log10(w.double().square().sum() / (w.double() - wq.double()).square().sum())


@pytest.mark.parametrize("k,min_db", [(2, 5.0), (3, 10.0), (4, 15.0), (5, 20.0)])
def test_sqnr_bounds(k: int, min_db: float, gen: torch.Generator) -> None:
    w = torch.randn(1024, 1024, generator=gen)  # 1M N(0,1) elements (seed 001 §12.2)
    cb = normal_float_codebook(k)
    wq = dequantize_kbit(*quantize_kbit(w, cb, k), cb, k)
    assert _sqnr_db(w, wq) > min_db


@pytest.mark.parametrize("k", BITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_block_error_bound(k: int, dtype: torch.dtype, gen: torch.Generator) -> None:
    """Seed 001 §12.1: |w - w_q| <= (max_gap / 2 + 1/16) * absmax + eps, per block.

    The bound is relative, so it holds where E4M4 is relative: block absmax >= 2^-10 (normal
    range). Below that E4M4 steps are absolute (2^-14); test_tiny_blocks_absolute_error covers it.
    """
    w = (torch.randn(64, 512, generator=gen) * (0.05 + torch.rand(64, 1, generator=gen) * 3)).to(dtype)
    cb = normal_float_codebook(k)
    packed, absmax = quantize_kbit(w, cb, k)
    assert packed.shape == (64, 512 // 32 * k) and absmax.shape == (64, 16)
    wq = dequantize_kbit(packed, absmax, cb, k, torch.float32)
    max_gap = (cb[1:] - cb[:-1]).max().item()
    blocks = w.float().reshape(64, 16, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    err = (blocks - wq.reshape(64, 16, 32)).abs()
    assert (err <= (max_gap / 2 + 1 / 16) * amax + 1e-6).all()


@pytest.mark.parametrize("k", BITS)
def test_tiny_blocks_absolute_error(k: int, gen: torch.Generator) -> None:
    """Subnormal E4M4 range: error <= max_gap / 2 * s + |absmax - s| with |absmax - s| <= 2^-15."""
    w = torch.randn(32, 256, generator=gen) * 1e-4
    cb = normal_float_codebook(k)
    wq = dequantize_kbit(*quantize_kbit(w, cb, k), cb, k)
    max_gap = (cb[1:] - cb[:-1]).max().item()
    amax = w.reshape(32, 8, 32).abs().amax(-1, keepdim=True)
    err = (w - wq).reshape(32, 8, 32).abs()
    assert (err <= max_gap / 2 * (amax + 2**-15) + 2**-15 + 1e-9).all()


@pytest.mark.parametrize("k", BITS)
def test_quantize_uses_stored_scale(k: int, gen: torch.Generator) -> None:
    """Codes are the nearest entries of w / s for the decoded E4M4 scale s (not the raw absmax)."""
    w = torch.randn(8, 64, generator=gen)
    cb = normal_float_codebook(k)
    packed, absmax = quantize_kbit(w, cb, k)
    s = decode_e4m4(absmax).repeat_interleave(32, dim=1)
    wq = dequantize_kbit(packed, absmax, cb, k)
    # every element's reconstruction is the best one available under scale s
    cand = cb.view(1, 1, -1) * s.unsqueeze(-1)
    best = (cand - w.unsqueeze(-1)).abs().amin(-1)
    assert torch.allclose((wq - w).abs(), best, atol=0, rtol=0)


def test_user_codebook_asymmetric(gen: torch.Generator) -> None:
    cb = torch.tensor([0.0, 0.25, 0.5, 1.0])  # all non-negative, like seed 001's asymmetric tests
    w = torch.rand(16, 64, generator=gen)
    wq = dequantize_kbit(*quantize_kbit(w, cb, 2), cb, 2)
    assert set(torch.unique(wq / decode_e4m4(quantize_kbit(w, cb, 2)[1]).repeat_interleave(32, 1)).tolist()) <= {
        0.0, 0.25, 0.5, 1.0}


def test_zero_block_and_tiny_values() -> None:
    w = torch.zeros(2, 64)
    w[1, 32:] = 1e-7  # below the smallest E4M4 subnormal: the block encodes as 0
    cb = normal_float_codebook(4)
    packed, absmax = quantize_kbit(w, cb, 4)
    assert absmax.tolist() == [[0, 0], [0, 0]]
    assert torch.equal(dequantize_kbit(packed, absmax, cb, 4), torch.zeros(2, 64))


def test_quantize_rejects_out_of_range() -> None:
    w = torch.zeros(3, 64)
    w[2, 40] = 100.0
    with pytest.raises(ValueError, match=r"row 2, input block 1.*E4M4 maximum"):
        quantize_kbit(w, normal_float_codebook(4), 4)
    w[2, 40] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_kbit(w, normal_float_codebook(4), 4)


@pytest.mark.parametrize("k", BITS)
@pytest.mark.parametrize("out_f,in_f", [(128, 64), (200, 96), (1000, 32), (5, 320)])
def test_tiled_round_trip(k: int, out_f: int, in_f: int, gen: torch.Generator) -> None:
    w = torch.randn(out_f, in_f, generator=gen)
    packed, absmax = quantize_kbit(w, normal_float_codebook(k), k)
    pt, at = to_tiled(packed, absmax, k)
    nt = -(-out_f // TILE_N)
    assert pt.shape == (nt, in_f // 32, k, TILE_N) and at.shape == (nt, in_f // 32, TILE_N)
    p2, a2 = from_tiled(pt, at, k, out_f)
    assert torch.equal(p2, packed) and torch.equal(a2, absmax)
    # padded rows are all zero (they dequantize to exactly 0)
    pad = nt * TILE_N - out_f
    if pad:
        assert not pt[-1, :, :, TILE_N - pad:].any() and not at[-1, :, TILE_N - pad:].any()


@pytest.mark.parametrize("k", [3, 4, 5])
def test_tiled_position(k: int, gen: torch.Generator) -> None:
    """Row r, block j lands in words [r // 128, j, :, r % 128], bit b of element e's code at bit
    tiled_bit_position(e, b, k) of word tiled_word(e, b, k) (the order the kernels' decode relies
    on: planes for k < 4, group words for k >= 4)."""
    out_f, nb = 300, 4
    packed = torch.randint(-(2**31), 2**31 - 1, (out_f, nb * k), generator=gen, dtype=torch.int32)
    absmax = torch.randint(0, 255, (out_f, nb), generator=gen, dtype=torch.uint8)
    pt, at = to_tiled(packed, absmax, k)
    for r, j in [(0, 0), (129, 2), (299, 3)]:
        for b in range(k):
            src = int(packed[r, j * k + b]) & 0xFFFFFFFF
            for e in range(32):
                dst = int(pt[r // 128, j, tiled_word(e, b, k), r % 128]) & 0xFFFFFFFF
                assert (src >> e) & 1 == (dst >> tiled_bit_position(e, b, k)) & 1, (r, j, b, e)
        assert at[r // 128, j, r % 128] == absmax[r, j]
    # every bit of a (row, block)'s k words holds exactly one (element, bit)
    slots = sorted((tiled_word(e, b, k), tiled_bit_position(e, b, k)) for e in range(32) for b in range(k))
    assert slots == [(w, q) for w in range(k) for q in range(32)]


# --- AWQ ------------------------------------------------------------------------------------------

def test_awq_hand_example() -> None:
    """One int32 holds outputs 0..7 at nibble slots AWQ_REVERSE_ORDER = 0,4,1,5,2,6,3,7."""
    nib = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=torch.uint8)
    # slot s holds output AWQ_ORDER[s] = 0,2,4,6,1,3,5,7 -> values 1,3,5,7,2,4,6,8 from slot 0 up
    expect = sum(v << (4 * s) for s, v in enumerate([1, 3, 5, 7, 2, 4, 6, 8]))
    assert expect == 0x86427531
    packed = pack_awq(nib)
    assert packed.dtype == torch.int32 and packed.item() == expect - 2**32
    assert torch.equal(unpack_awq(packed), nib)
    assert AWQ_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)


def test_awq_dequantize_hand_example() -> None:
    # in=32 (one group of 32), out=8: w[i, o] = s[o] * (q[i, o] - z[o])
    q = torch.arange(8, dtype=torch.uint8).repeat(32, 1)  # q[i, o] = o
    z = torch.full((1, 8), 3, dtype=torch.uint8)
    s = torch.tensor([[0.5] * 8], dtype=torch.float16)
    w = dequantize_awq(pack_awq(q), pack_awq(z), s, 32)
    assert w.shape == (8, 32)  # [out, in]
    assert torch.equal(w[:, 0], torch.tensor([-1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2], dtype=torch.float16))


@pytest.mark.parametrize("gs", [32, 64, 128])
def test_awq_rtn_round_trip(gs: int, gen: torch.Generator) -> None:
    w = torch.randn(64, 256, generator=gen)
    qw, qz, s = quantize_awq_rtn(w, gs)
    assert qw.shape == (256, 8) and qz.shape == (256 // gs, 8) and s.shape == (256 // gs, 64)
    wq = dequantize_awq(qw, qz, s, gs, torch.float32)
    # asymmetric 4-bit RTN: error at most half a step (plus fp16 scale rounding)
    step = s.float().repeat_interleave(gs, dim=0).t()
    assert ((wq - w).abs() <= step * 0.5 + step * 16 * 2**-10 + 1e-6).all()
    assert torch.equal(pack_awq(unpack_awq(qw)), qw)
