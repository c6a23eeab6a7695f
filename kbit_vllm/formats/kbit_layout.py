"""The tiled kbit layout that every CUDA kernel reads, and the lossless repack to and from it.

Serialized (portable, TP-shardable) format:
  packed [out, in/32*k] int32, absmax [out, in/32] uint8.
Tiled (resident) format, TILE_N = 128 output rows per tile, rows padded to a multiple of
TILE_N with zero words and zero absmax (so padded rows dequantize to exactly 0):
  packed_tiled [n_tiles, in/32, k, TILE_N] int32
  absmax_tiled [n_tiles, in/32, TILE_N]    uint8
Inside one n-tile, input block j, bit plane b, the 128 words of the tile's rows are
contiguous: a warp reading one plane for 32 rows reads 128 consecutive bytes, an MMA warp
reading the words of 8 rows hits 8 distinct banks, and a kernel streaming a whole n-tile
over K reads one contiguous span of memory.

Bit order inside a tiled word (differs from the serialized word, where bit e is element e):
element e of the block is named (group g, field n) with g = (e >> 1) & 3 and
n = (e & 1) | (e >> 3) << 1, i.e. group g holds elements 2g + {0, 1, 8, 9, 16, 17, 24, 25},
exactly the 8 k-rows one thread of an mma.m16n8k16 B fragment needs (thread lane % 4 == g).
Bit b of element (g, n)'s code sits at bit tiled_bit_position(e, b, k) of word tiled_word(e, b, k):
- k = 2, 3: bit (4n + g + b) mod 32 of word b (bit plane b). The bits of group g sit at positions
  = g + b (mod 4), so one or two bit-selects (lop3) of the planes and a rotation right by g give
  one word whose nibble n holds element (g, n)'s code (the bits above k belong to other planes;
  decoders ignore them).
- k = 4, 5: bits 0..3 at bit 4n + b of word g (the group word: nibble n is field n's code, which
  a kernel reads as is), bit 4 (k = 5) at bit (4n + g + 4) mod 32 of word 4. Built from the planes
  of the k < 4 order: plane and group swapped (a bit of position q in plane (q - g) mod 4 moves to
  word g, the same position), then word g rotated right by g.
"""

from __future__ import annotations

import torch

TILE_N = 128


def tiled_bit_position(e: int, b: int, k: int) -> int:
    """Bit of tiled word tiled_word(e, b, k) that holds bit b of element e's code (see the module
    docstring); any k < 4 gives the bit-plane order the k >= 4 order starts from."""
    g = (e >> 1) & 3
    n = (e & 1) | ((e >> 3) << 1)
    return (4 * n + b) % 32 if k >= 4 and b < 4 else (4 * n + g + b) % 32


def tiled_word(e: int, b: int, k: int) -> int:
    """Which of the k tiled words of a (row, block) holds bit b of element e's code."""
    return (e >> 1) & 3 if k >= 4 and b < 4 else b


def _byte_luts(perm: list[int]) -> torch.Tensor:
    """[4, 256] int64: entry (i, v) is byte v of a word (at byte i) with bit j moved to perm[j]."""
    luts = torch.zeros(4, 256, dtype=torch.int64)
    v = torch.arange(256)
    for i in range(4):
        for j in range(8):
            luts[i] |= ((v >> j) & 1) << perm[8 * i + j]
    return luts


# The bit-plane order (k < 4): tiled_bit_position(e, b, 2) = (P0(e) + b) mod 32, a fixed
# permutation, then a rotation by b.
_P0 = [tiled_bit_position(e, 0, 2) for e in range(32)]
_P0_INV = [_P0.index(p) for p in range(32)]
_LUT_TO, _LUT_FROM = _byte_luts(_P0), _byte_luts(_P0_INV)


def _apply(w: torch.Tensor, luts: torch.Tensor) -> torch.Tensor:
    luts = luts.to(w.device)
    return luts[0][w & 255] | luts[1][(w >> 8) & 255] | luts[2][(w >> 16) & 255] | luts[3][(w >> 24) & 255]


# Word g of the k >= 4 order takes the bits at positions q with (q - g) mod 4 = b from plane b
# (GROUP_MASKS[g, b]; also how backends/cpu/kbit_tables.py builds group words for k < 4).
GROUP_MASKS = torch.tensor([[0x11111111 << ((g + b) & 3) for b in range(4)] for g in range(4)], dtype=torch.int64)


def _swap_groups(w: torch.Tensor) -> torch.Tensor:
    """[..., k, T] int64 words, k >= 4: words 0..3 from plane order to unrotated group order (or
    back: the swap is its own inverse); word 4 stays."""
    head = w[..., :4, :].unsqueeze(-3)  # [..., 1, 4 (b), T]
    groups = (head & GROUP_MASKS.to(w.device)[:, :, None]).sum(dim=-2)  # disjoint masks: sum = or
    return torch.cat([groups, w[..., 4:, :]], dim=-2)


def _rotate_groups(w: torch.Tensor, right: bool) -> torch.Tensor:
    """[..., k, T] int64 words, k >= 4: word g (g < 4) rotated right by g (or back); word 4 stays."""
    k = w.shape[-2]
    s = torch.tensor([g if g < 4 else 0 for g in range(k)], dtype=torch.int64, device=w.device).view(k, 1)
    if not right:
        s = (32 - s) % 32
    return ((w >> s) | (w << ((32 - s) % 32))) & 0xFFFFFFFF


def _permute_bits(words: torch.Tensor, k: int, to_tile: bool) -> torch.Tensor:
    """words [..., k, T] int32; move bit e of plane b to tiled_bit_position(e, b, k) of word
    tiled_word(e, b, k), or back.

    Byte lookup tables plus a per-plane rotation (and, for k >= 4, the group swap and rotation): a
    handful of tensor ops, not 32 * k.
    """
    w = words.to(torch.int64) & 0xFFFFFFFF
    b = torch.arange(k, dtype=torch.int64, device=w.device).view(k, 1)
    if to_tile:
        w = _apply(w, _LUT_TO)
        out = ((w << b) | (w >> (32 - b))) & 0xFFFFFFFF
        if k >= 4:
            out = _rotate_groups(_swap_groups(out), right=True)
    else:
        if k >= 4:
            w = _swap_groups(_rotate_groups(w, right=False))
        w = ((w >> b) | (w << (32 - b))) & 0xFFFFFFFF
        out = _apply(w, _LUT_FROM)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def n_tiles_for(out_features: int) -> int:
    return (out_features + TILE_N - 1) // TILE_N


def to_tiled(packed: torch.Tensor, absmax: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Serialized -> tiled. Shapes as in the module docstring."""
    out_f, nb = absmax.shape
    nt = n_tiles_for(out_f)
    pad = nt * TILE_N - out_f
    p = packed.reshape(out_f, nb, k)
    a = absmax
    if pad:
        p = torch.cat([p, p.new_zeros(pad, nb, k)], dim=0)
        a = torch.cat([a, a.new_zeros(pad, nb)], dim=0)
    p_t = _permute_bits(p.reshape(nt, TILE_N, nb, k).permute(0, 2, 3, 1), k, to_tile=True).contiguous()
    a_t = a.reshape(nt, TILE_N, nb).permute(0, 2, 1).contiguous()
    return p_t, a_t


def from_tiled(
    packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor, k: int, out_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled -> serialized, dropping the padded rows."""
    nt, nb, kk, tn = packed_tiled.shape
    p = _permute_bits(packed_tiled, kk, to_tile=False).permute(0, 3, 1, 2).reshape(nt * tn, nb * kk)[:out_features]
    a = absmax_tiled.permute(0, 2, 1).reshape(nt * tn, nb)[:out_features]
    return p.contiguous(), a.contiguous()
