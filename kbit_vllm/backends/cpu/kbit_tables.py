"""kbit linear layers on CPU: dequantize straight from the tiled layout through lookup tables.

The reference (backends/reference.py) unpermutes the tiled bits word by word, unpacks one code
per weight and scales it: clear, and 100-200x slower than the bf16 matmul it feeds. Here one table
lookup yields two finished weights. Its index joins
- the byte that holds the low four code bits of fields 2j and 2j + 1 of group g: byte j of the
  block's group word g (formats/kbit_layout.py; k < 4 builds group words from the bit planes),
- for k = 5, the two codes' fifth bits (bits 8, 9),
- and the block's absmax byte;
its entry is (codebook[code] * scale) of both weights, computed in fp32 and rounded to the
activation dtype exactly as formats.kbit.dequantize_kbit does, so the weights are bit for bit the
reference's. They stay in the group words' byte order (column_order: a transpose of every byte
costs more than the rest), and the activation's columns are permuted to match before one matmul.

Rows go a few tiles at a time (CHUNK_WEIGHTS) through per-thread scratch buffers: on a VM a fresh
8 MB buffer costs about half as much in page faults as the table lookups that fill it (0.9 against
1.4-2.4 ms). A thread that ran the op keeps them: 19 MB at 2-byte activations and k <= 4, 35 MB at fp32 and
k = 5 (more only where one 128-row tile holds more than CHUNK_WEIGHTS weights: in > 32768).
"""

from __future__ import annotations

import functools
import math
import sys
import threading

import torch
import torch.nn.functional as F

from ... import op_checks as C
from ...formats import TILE_N
from ...formats.e4m4 import E4M4_TABLE
from ...formats.kbit_layout import GROUP_MASKS
from .. import reference as ref

# Weights dequantized at once: bounds the scratch (8 MB of indices, 8 MB of 2-byte weights).
CHUNK_WEIGHTS = 1 << 22

# A pair of weights as one integer, so that a lookup moves one element.
_PAIR_INT = {2: torch.int32, 4: torch.int64}

# Group word g (the k >= 4 order) from k < 4 bit planes: the bits of plane b at positions q with
# (q - g) mod 4 = b (kbit_layout.GROUP_MASKS[g, b], as int32), OR-ed, then rotated right by g.
_GROUP_MASKS = GROUP_MASKS[:, :3].to(torch.int32)  # values >= 2^31 wrap to their int32 bits
_GROUP_SHIFTS = torch.arange(4, dtype=torch.int32).view(4, 1)


def _pair_bits(k: int) -> int:
    """Index bits below the absmax byte: the pair byte, and for k = 5 the two fifth bits."""
    return 10 if k == 5 else 8


@functools.lru_cache(maxsize=32)
def _weight_table(codebook_bits: tuple[int, ...], k: int, dtype: torch.dtype) -> torch.Tensor:
    """[2^(pair bits + 8)] pairs of dtype weights, one integer each: (codebook[lo] * scale,
    codebook[hi] * scale) for the index (absmax byte << pair bits) | pair bits. The codebook comes
    as its float32 bit patterns, so that -0.0 and NaN entries key the cache exactly."""
    pb = _pair_bits(k)
    idx = torch.arange(1 << (pb + 8), dtype=torch.int64)
    pair, scale = idx & ((1 << pb) - 1), E4M4_TABLE[idx >> pb]
    lo, hi = pair & 15, (pair >> 4) & 15
    if k == 5:
        lo, hi = lo | ((pair >> 8) & 1) << 4, hi | ((pair >> 9) & 1) << 4
    cb = torch.zeros(32, dtype=torch.float32)  # codes >= 2^k never occur for k < 4
    cb[: len(codebook_bits)] = torch.tensor(codebook_bits, dtype=torch.int32).view(torch.float32)
    pairs = torch.stack([cb[lo] * scale, cb[hi] * scale], dim=-1).to(dtype)
    return pairs.view(_PAIR_INT[dtype.itemsize]).reshape(-1)


def _rotate_right(words: torch.Tensor, r: torch.Tensor | int) -> torch.Tensor:
    """int32 words rotated right by r (1..31, or a tensor of them) bits (PyTorch's int32 shifts:
    arithmetic right, wrapping left)."""
    return ((words >> r) & ((1 << (32 - r)) - 1)) | (words << (32 - r))


class _Scratch(threading.local):
    """Per-thread buffers, grown to the largest chunk seen and reused."""

    def __init__(self) -> None:
        self.bufs: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        buf = self.bufs.get(name)
        if buf is None or buf.numel() < nbytes:
            buf = self.bufs[name] = torch.empty(nbytes, dtype=torch.uint8)
        return buf[:nbytes].view(dtype).view(shape)


_SCRATCH = _Scratch()


def _group_words(packed: torch.Tensor, k: int) -> torch.Tensor:
    """int32 [t, in/32, 4, TILE_N]: the k >= 4 group words of tiles packed [t, in/32, k, TILE_N]
    (for k >= 4 its first four words)."""
    if k >= 4:
        return packed[:, :, :4]
    masked = packed.unsqueeze(2) & _GROUP_MASKS[:, :k, None]  # [t, nb, 4 (g), k, T]
    words = masked.sum(dim=3, dtype=torch.int32)  # the masks are disjoint: sum = or
    words[:, :, 1:] = _rotate_right(words[:, :, 1:], _GROUP_SHIFTS[1:])
    return words


def _fifth_bits(packed: torch.Tensor) -> torch.Tensor:
    """k = 5: int32 [t, in/32, 4, TILE_N] whose byte j of word g holds the fifth bits of fields 2j,
    2j + 1 of group g at bits 0, 1 (word 4 rotated right by 4 has field n's at bit 4n + g)."""
    w = _rotate_right(packed[:, :, 4:5], 4)
    return ((w >> _GROUP_SHIFTS) & 0x01010101) | ((w >> (_GROUP_SHIFTS + 3)) & 0x02020202)


def column_order() -> torch.Tensor:
    """The element of a block at each column of dequantize_tiles' blocks: group g, byte j, field
    2j + h holds element 2g + 8j + h."""
    g, j, h = torch.meshgrid(torch.arange(4), torch.arange(4), torch.arange(2), indexing="ij")
    return (2 * g + 8 * j + h).reshape(32)


_COLUMN_ORDER = column_order()


def dequantize_tiles(packed: torch.Tensor, absmax: torch.Tensor, codebook: torch.Tensor, k: int,
                     dtype: torch.dtype) -> torch.Tensor:
    """W [t * TILE_N, in] in dtype of tiles packed [t, in/32, k, TILE_N], absmax [t, in/32, TILE_N]
    (padded rows included): the reference's dequantize_tiled with each block's columns in
    column_order(). The result lives in this thread's scratch until the next call."""
    nt, nb = absmax.shape[0], absmax.shape[1]
    lead = (nt, TILE_N, nb)
    words = _SCRATCH.get("words", (*lead, 4), torch.int32)
    words.copy_(_group_words(packed, k).permute(0, 3, 1, 2))
    idx = _SCRATCH.get("idx", (*lead, 16), torch.int32)
    idx.copy_(words.view(torch.uint8).view(*lead, 16))
    if k == 5:
        words.copy_(_fifth_bits(packed).permute(0, 3, 1, 2))
        fifth = _SCRATCH.get("fifth", (*lead, 16), torch.int32)
        fifth.copy_(words.view(torch.uint8).view(*lead, 16))
        idx.bitwise_or_(fifth.bitwise_left_shift_(8))
    scale = _SCRATCH.get("scale", lead, torch.int32)
    scale.copy_(absmax.permute(0, 2, 1))
    idx.bitwise_or_(scale.bitwise_left_shift_(_pair_bits(k)).unsqueeze(-1))
    table = _weight_table(tuple(codebook.view(torch.int32).tolist()), k, dtype)
    pairs = _SCRATCH.get("weights", (idx.numel(),), table.dtype)
    torch.index_select(table, 0, idx.view(-1), out=pairs)
    return pairs.view(dtype).view(nt * TILE_N, nb * 32)


def usable(dtype: torch.dtype) -> bool:
    """The table path needs 2- or 4-byte activations and little-endian words (bytes in order)."""
    return dtype.itemsize in _PAIR_INT and sys.byteorder == "little"


def _linear_rows(x2: torch.Tensor, packed: torch.Tensor, absmax: torch.Tensor, codebook: torch.Tensor, k: int,
                 out_features: int) -> torch.Tensor:
    """x2 [m, in] @ W^T of one tiled weight, CHUNK_WEIGHTS at a time: y [m, out_features]."""
    nt, nb = absmax.shape[0], absmax.shape[1]
    xp = x2.reshape(-1, nb, 32)[:, :, _COLUMN_ORDER].reshape(-1, nb * 32)
    step = max(1, CHUNK_WEIGHTS // (TILE_N * nb * 32))
    y = x2.new_empty((x2.shape[0], out_features))
    for t0 in range(0, nt, step):
        r0, r1 = t0 * TILE_N, min(out_features, (t0 + step) * TILE_N)
        w = dequantize_tiles(packed[t0:t0 + step], absmax[t0:t0 + step], codebook, k, x2.dtype)
        y[:, r0:r1] = F.linear(xp, w[: r1 - r0])
    return y


def kbit_linear(x, packed_tiled, absmax_tiled, codebook, bias, k, out_features):
    C.check_kbit_linear(x, packed_tiled, absmax_tiled, codebook, bias, k, out_features)
    if not usable(x.dtype):
        return ref.kbit_linear(x, packed_tiled, absmax_tiled, codebook, bias, k, out_features)
    x2 = x.reshape(-1, x.shape[-1])
    y = _linear_rows(x2, packed_tiled, absmax_tiled, codebook, k, out_features)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], out_features)


def kbit_grouped_linear(x, packed_tiled, absmax_tiled, codebook, expert_offsets, k, out_features):
    C.check_grouped(x, packed_tiled, absmax_tiled, codebook, expert_offsets, k, out_features)
    if not usable(x.dtype):
        return ref.kbit_grouped_linear(x, packed_tiled, absmax_tiled, codebook, expert_offsets, k, out_features)
    return ref.grouped_by_offsets(
        x, expert_offsets, out_features, "kbit_grouped_linear",
        lambda e, rows: _linear_rows(rows, packed_tiled[e], absmax_tiled[e], codebook, k, out_features))
