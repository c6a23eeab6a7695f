"""The read-only stream kernel (csrc/stream_read.cu), which benchmarks/bench_floor.py times as the cost of
reading a layer's weights: it must read every byte, once, at every unroll and grid. The XOR of the
sinks its CTAs write equals the XOR of the tensor's 32-bit words (computed on the CPU). Fresh random
tensors each run, sinks poisoned first. The GPU tests skip cleanly without a CUDA GPU or a library
built for it; the argument checks run anywhere.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cuda_helpers import cuda_kernels_ok

from kbit_vllm.backends.cuda import stream_read as sr

_OK, _WHY = cuda_kernels_ok()
gpu = pytest.mark.skipif(not _OK, reason=f"CUDA kbit kernels unavailable: {_WHY}")

DEV = "cuda"
POISON = 0x5A5A5A5A


def _xor_words(t: torch.Tensor) -> int:
    words = t.contiguous().view(torch.int32).cpu().numpy().view(np.uint32)
    return int(np.bitwise_xor.reduce(words)) if words.size else 0


def _xor_sinks(sink: torch.Tensor, ctas: int) -> int:
    return int(np.bitwise_xor.reduce(sink[:ctas].cpu().numpy().view(np.uint32)))


@gpu
@pytest.mark.parametrize("unroll", (2, 4, 8))
# bytes: empty, one 16-byte word, less than one chunk, a partial last chunk, several strides of the grid
@pytest.mark.parametrize("nbytes", (0, 16, 4096 + 48, 3 * 8192 * 16 + 208, 5 << 20))
@pytest.mark.parametrize("ctas", (1, 7, 264))
@pytest.mark.parametrize("wait_first", (False, True))
def test_stream_read_reads_every_word(unroll, nbytes, ctas, wait_first):
    t = torch.randint(-(2**31), 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device=DEV)
    sink = torch.full((ctas + 3,), POISON, dtype=torch.int32, device=DEV)
    sr.stream_read(t, sink, ctas, unroll, wait_first)
    torch.cuda.synchronize()
    assert _xor_sinks(sink, ctas) == _xor_words(t)
    assert (sink[ctas:] == POISON).all(), "a CTA wrote past its sink word"


@gpu
@pytest.mark.parametrize("dtype", (torch.uint8, torch.float16, torch.int32))
def test_stream_read_any_dtype_and_one_wave(dtype):
    """Weight tensors of any element type, at the resident grid the benchmark uses."""
    t = (torch.randn(3 << 18, device=DEV) * 1000).to(dtype)
    for unroll in sr.UNROLLS:
        assert sr.ctas_per_sm(unroll) >= 1
        ctas = sr.one_wave(t.device, unroll)
        sink = torch.full((ctas,), POISON, dtype=torch.int32, device=DEV)
        sr.stream_read(t, sink, ctas, unroll)
        torch.cuda.synchronize()
        assert _xor_sinks(sink, ctas) == _xor_words(t)


@gpu
def test_stream_read_graph_replay():
    """Captured once, replayed on new contents: the replay reads the tensor as it is then."""
    t = torch.randint(-(2**31), 2**31 - 1, (1 << 16,), dtype=torch.int32, device=DEV)
    sink = torch.zeros(132, dtype=torch.int32, device=DEV)
    sr.stream_read(t, sink, 132, 4)  # warm-up outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sr.stream_read(t, sink, 132, 4)
    t.copy_(torch.randint(-(2**31), 2**31 - 1, t.shape, dtype=torch.int32, device=DEV))
    sink.fill_(POISON)
    g.replay()
    torch.cuda.synchronize()
    assert _xor_sinks(sink, 132) == _xor_words(t)


@gpu
def test_stream_read_rejects_bad_input():
    t = torch.zeros(64, dtype=torch.int32, device=DEV)
    sink = torch.zeros(8, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="multiple of 16"):
        sr.stream_read(t[:3], sink, 4)  # 12 bytes
    with pytest.raises(ValueError, match="16-byte aligned"):
        sr.stream_read(t[1:5], sink, 4)  # 4-byte offset
    with pytest.raises(ValueError, match="at least ctas=9"):
        sr.stream_read(t, sink, 9)
    with pytest.raises(ValueError, match="unroll"):
        sr.stream_read(t, sink, 4, unroll=3)
    with pytest.raises(ValueError, match="int32"):
        sr.stream_read(t, sink.float(), 4)


def test_stream_read_rejects_host_tensors():
    """A CPU tensor (or a CPU sink) is refused with the reason, before any library call."""
    t = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(ValueError, match="contiguous CUDA tensor.*device cpu"):
        sr.stream_read(t, torch.zeros(8, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="unroll must be one of"):
        sr.ctas_per_sm(3)
