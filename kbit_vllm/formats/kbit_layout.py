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
"""

from __future__ import annotations

import torch

TILE_N = 128


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
    p_t = p.reshape(nt, TILE_N, nb, k).permute(0, 2, 3, 1).contiguous()
    a_t = a.reshape(nt, TILE_N, nb).permute(0, 2, 1).contiguous()
    return p_t, a_t


def from_tiled(
    packed_tiled: torch.Tensor, absmax_tiled: torch.Tensor, k: int, out_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled -> serialized, dropping the padded rows."""
    nt, nb, kk, tn = packed_tiled.shape
    p = packed_tiled.permute(0, 3, 1, 2).reshape(nt * tn, nb * kk)[:out_features]
    a = absmax_tiled.permute(0, 2, 1).reshape(nt * tn, nb)[:out_features]
    return p.contiguous(), a.contiguous()
