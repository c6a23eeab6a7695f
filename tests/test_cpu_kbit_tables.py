"""The CPU kbit linear ops (backends/cpu/kbit_tables.py) against the reference dequantization.

Tiled words and absmax bytes are drawn at random: every bit pattern is a valid tiled encoding,
so each table entry, every E4M4 value (zero and subnormals too) and the padded rows are met.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import kbit_vllm  # noqa: F401  (registers the op implementations)
from kbit_vllm import ops
from kbit_vllm.backends import reference
from kbit_vllm.backends.cpu import kbit_tables
from kbit_vllm.formats import TILE_N

BITS = (2, 3, 4, 5)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Relative (max-norm) error of y against the float64 product of the reference's weights in the
# activation dtype: only the matmul's rounding remains.
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _random_tiled(gen: torch.Generator, k: int, out_f: int, in_f: int,
                  experts: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    nt, nb = -(-out_f // TILE_N), in_f // 32
    packed = torch.randint(-2**31, 2**31 - 1, (*experts, nt, nb, k, TILE_N), generator=gen, dtype=torch.int32)
    absmax = torch.randint(0, 256, (*experts, nt, nb, TILE_N), generator=gen, dtype=torch.uint8)
    return packed, absmax, torch.randn(1 << k, generator=gen)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("k", BITS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_tiles_is_the_reference(k: int, dtype: torch.dtype, gen: torch.Generator) -> None:
    out_f, in_f = 300, 96  # three tiles, the last one padded
    packed, absmax, cb = _random_tiled(gen, k, out_f, in_f)
    w = kbit_tables.dequantize_tiles(packed, absmax, cb, k, dtype)
    assert w.shape == (3 * TILE_N, in_f) and w.dtype == dtype
    assert sorted(kbit_tables.column_order().tolist()) == list(range(32))
    expect = reference.dequantize_tiled(packed, absmax, cb, k, out_f, dtype)
    assert torch.equal(_bits(_natural(w[:out_f])), _bits(expect))


def _natural(w: torch.Tensor) -> torch.Tensor:
    """dequantize_tiles' weights with each block's columns back in element order."""
    out_f, in_f = w.shape
    natural = torch.empty_like(w).view(out_f, in_f // 32, 32)
    natural[:, :, kbit_tables.column_order()] = w.view(out_f, in_f // 32, 32)
    return natural.view(out_f, in_f)


def _bits(w: torch.Tensor) -> torch.Tensor:
    """The bit patterns of w, so that -0.0 and 0.0 (and NaNs) compare as stored."""
    return w.view({2: torch.int16, 4: torch.int32}[w.dtype.itemsize])


def test_signed_zero_codebooks_keep_their_tables(gen: torch.Generator) -> None:
    """The tables are cached per codebook: one whose zero is -0.0 is not served the +0.0 one's."""
    packed, absmax, _ = _random_tiled(gen, 2, 128, 32)
    for zero in (0.0, -0.0, 0.0):
        cb = torch.tensor([-1.0, zero, 0.5, 1.0])
        w = kbit_tables.dequantize_tiles(packed, absmax, cb, 2, torch.bfloat16)
        expect = reference.dequantize_tiled(packed, absmax, cb, 2, 128, torch.bfloat16)
        assert torch.equal(_bits(_natural(w)), _bits(expect))


@pytest.mark.parametrize("k", BITS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_in_chunks(k: int, dtype: torch.dtype, gen: torch.Generator,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    """One tile per chunk: the rows of every chunk, the last partial one included, land in place."""
    out_f, in_f = 300, 64
    packed, absmax, cb = _random_tiled(gen, k, out_f, in_f)
    w = reference.dequantize_tiled(packed, absmax, cb, k, out_f, dtype).double()
    x = torch.randn(2, 3, in_f, generator=gen).to(dtype)
    bias = torch.randn(out_f, generator=gen).to(dtype)
    whole = ops.kbit_linear(x, packed, absmax, cb, bias, k, out_f)
    monkeypatch.setattr(kbit_tables, "CHUNK_WEIGHTS", TILE_N * in_f)
    y = ops.kbit_linear(x, packed, absmax, cb, bias, k, out_f)
    assert y.shape == (2, 3, out_f) and y.dtype == dtype
    expect = F.linear(x.double(), w) + bias.double()
    assert _rel(y, expect) < TOL[dtype] and _rel(whole, expect) < TOL[dtype]
    assert ops.kbit_linear(x[:0], packed, absmax, cb, None, k, out_f).shape == (0, 3, out_f)


@pytest.mark.parametrize("k", (3, 5))
def test_grouped_linear_in_chunks(k: int, gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    n_exp, out_f, in_f = 4, 200, 64
    packed, absmax, cb = _random_tiled(gen, k, out_f, in_f, (n_exp,))
    tokens = [2, 0, 5, 1]  # one expert without tokens
    offsets = torch.tensor([0, *torch.tensor(tokens).cumsum(0).tolist()], dtype=torch.int64)
    x = torch.randn(sum(tokens), in_f, generator=gen).to(torch.bfloat16)
    monkeypatch.setattr(kbit_tables, "CHUNK_WEIGHTS", TILE_N * in_f)
    y = ops.kbit_grouped_linear(x, packed, absmax, cb, offsets, k, out_f)
    for e in range(n_exp):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi > lo:
            w = reference.dequantize_tiled(packed[e], absmax[e], cb, k, out_f, torch.bfloat16).double()
            assert _rel(y[lo:hi], F.linear(x[lo:hi].double(), w)) < TOL[torch.bfloat16]


def test_the_cpu_op_is_the_table_path(gen: torch.Generator) -> None:
    packed, absmax, cb = _random_tiled(gen, 4, 130, 64)
    x = torch.randn(3, 64, generator=gen)
    assert torch.equal(ops.kbit_linear(x, packed, absmax, cb, None, 4, 130),
                       kbit_tables.kbit_linear(x, packed, absmax, cb, None, 4, 130))


def test_threads_keep_their_own_scratch(gen: torch.Generator) -> None:
    """The scratch buffers are per thread: two threads dequantizing different layers at once each
    get their own weights."""
    layers = [_random_tiled(gen, k, 512, 512) for k in (2, 5)]
    xs = [torch.randn(4, 512, generator=gen) for _ in layers]
    expect = [F.linear(x, reference.dequantize_tiled(p, a, cb, k, 512, x.dtype))
              for x, (p, a, cb), k in zip(xs, layers, (2, 5), strict=True)]
    bad: list[str] = []

    def run(i: int, k: int) -> None:
        p, a, cb = layers[i]
        for _ in range(50):
            if _rel(kbit_tables.kbit_linear(xs[i], p, a, cb, None, k, 512), expect[i].double()) > 1e-5:
                bad.append(f"thread {i}")
                return

    threads = [threading.Thread(target=run, args=(i, k)) for i, k in enumerate((2, 5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
