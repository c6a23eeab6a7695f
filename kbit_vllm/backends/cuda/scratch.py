"""Torch-allocated scratch for the split-K / stream-K kernels (kbit and awq), one pool per device.

Tile counters must be zero on entry; the kernels leave them zero, so one zeroed buffer per device
serves every call (and every captured graph). "accum" buffers are zeroed fp32 sums that the
kernels also leave zeroed; "partials" (any other kind) need no zeroing. Buffers are never freed
once handed out: a captured graph keeps using the pointer it saw.
"""

from __future__ import annotations

import torch

_SCRATCH: dict[tuple[int, str], list[torch.Tensor]] = {}


def scratch(device: torch.device, kind: str, numel: int) -> torch.Tensor:
    """A buffer of at least numel elements of `kind` ("counters" int32 zeroed, "accum" fp32 zeroed,
    else fp32) on device, grown by doubling."""
    key = (device.index if device.index is not None else torch.cuda.current_device(), kind)
    held = _SCRATCH.setdefault(key, [])
    if held and held[-1].numel() >= numel:
        return held[-1]
    size = max(numel, 2 * held[-1].numel() if held else 0, 1 << 16)
    if kind == "counters":
        t = torch.zeros(size, dtype=torch.int32, device=device)
    elif kind == "accum":  # zeroed fp32 sums, left zeroed by the kernels that use them
        t = torch.zeros(size, dtype=torch.float32, device=device)
    else:
        t = torch.empty(size, dtype=torch.float32, device=device)
    if not torch.cuda.is_current_stream_capturing():
        held.append(t)  # memory from a graph's private pool must not outlive that graph's use
    return t
