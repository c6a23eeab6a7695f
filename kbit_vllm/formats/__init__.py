"""Pure tensor math for the kbit and AWQ formats; no kernels, no devices assumed."""

from .awq import (
    AWQ_GROUP_SIZES,
    AWQ_ORDER,
    AWQ_REVERSE_ORDER,
    awq_to_int4_affine,
    dequantize_awq,
    pack_awq,
    quantize_awq_rtn,
    unpack_awq,
)
from .bitplanes import pack_bitplanes, unpack_bitplanes
from .codebook import SUPPORTED_BITS, check_bits, check_codebook, normal_float_codebook
from .e4m4 import E4M4_BIAS, E4M4_MAX, decode_e4m4, encode_e4m4
from .kbit import BLOCK, block_absmax, check_block_absmax, dequantize_kbit, quantize_kbit, unpack_codes
from .kbit_layout import TILE_N, from_tiled, n_tiles_for, to_tiled

__all__ = [
    "AWQ_GROUP_SIZES", "AWQ_ORDER", "AWQ_REVERSE_ORDER", "BLOCK", "E4M4_BIAS", "E4M4_MAX",
    "block_absmax", "check_block_absmax",
    "SUPPORTED_BITS", "TILE_N", "awq_to_int4_affine", "check_bits", "check_codebook",
    "decode_e4m4", "dequantize_awq", "dequantize_kbit", "encode_e4m4", "from_tiled",
    "n_tiles_for", "normal_float_codebook", "pack_awq", "pack_bitplanes", "quantize_awq_rtn",
    "quantize_kbit", "to_tiled", "unpack_awq", "unpack_bitplanes", "unpack_codes",
]
