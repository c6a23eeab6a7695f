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
Plane b stores element (g, n) at bit (4n + g + b) mod 32. So for b < 4 the bits of group g
sit at positions = g + b (mod 4): three bit-selects (lop3) of the planes give one word whose
nibble n, after rotating right by 4n + g, is element (g, n)'s code (plane 4, for k = 5,
rotated the same way, lands at bit 4). Decoding 8 codes costs ~3 + 8 integer ops instead
of k shift/and/or per element.
"""

from __future__ import annotations

import torch

TILE_N = 128


def tiled_bit_position(e: int, b: int) -> int:
    """Bit of tiled plane word b that holds element e of the block (see module docstring)."""
    g = (e >> 1) & 3
    n = (e & 1) | ((e >> 3) << 1)
    return (4 * n + g + b) % 32


def _positions(k: int, device: torch.device) -> torch.Tensor:
    """[k, 32] int64: column e of row b is tiled_bit_position(e, b)."""
    return torch.tensor([[tiled_bit_position(e, b) for e in range(32)] for b in range(k)],
                        dtype=torch.int64, device=device)


def _permute_bits(words: torch.Tensor, k: int, to_tile: bool) -> torch.Tensor:
    """words [..., k, T] int32; move bit e of plane b to tiled_bit_position(e, b) or back."""
    pos = _positions(k, words.device)  # [k, 32]
    src_e = torch.arange(32, dtype=torch.int64, device=words.device).expand(k, 32)
    src, dst = (src_e, pos) if to_tile else (pos, src_e)
    w = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros_like(w)
    for b in range(k):
        wb = w[..., b, :]
        acc = torch.zeros_like(wb)
        for e in range(32):
            acc |= ((wb >> int(src[b, e])) & 1) << int(dst[b, e])
        out[..., b, :] = acc
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
