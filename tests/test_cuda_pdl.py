"""Kernels launched with programmatic dependent launch (csrc/pdl.cuh) see their predecessors' writes.

A PDL kernel may start while the kernel before it is still running; it must not read x or the
expert offsets, nor touch y or the shared scratch, before griddepcontrol.wait. These tests chain
the PDL kernels back to back so each one's input is the output its predecessor is still writing
(and the stream-K ones share one scratch accumulator), eagerly and in CUDA-graph replays with new
inputs, and check every link against a float64 product of that link's actual input. An input
read too early is NaN (poisoned allocations) or the previous replay's value, and fails the check.
Skips cleanly without a CUDA GPU or a library built for it.
"""

from __future__ import annotations

import pytest
import torch
from cuda_helpers import assert_close_max_norm, captured, cuda_kernels_ok, poison_allocator

from kbit_vllm import ops
from kbit_vllm.formats import dequantize_kbit, normal_float_codebook, quantize_awq_rtn, unpack_awq

_OK, _WHY = cuda_kernels_ok()
pytestmark = pytest.mark.skipif(not _OK, reason=f"CUDA kernels unavailable: {_WHY}")

if _OK:
    from kbit_vllm.backends.cuda import awq_ops
    from kbit_vllm.backends.cuda import ops as cuda_ops

DEV = "cuda"
DTYPES = (torch.float16, torch.bfloat16)
KBIT_TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
AWQ_TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2}
DIM = 4096  # square layers, so each link's output is the next one's input


def _close(y: torch.Tensor, x: torch.Tensor, w64: torch.Tensor, tol: float, what: str) -> None:
    assert_close_max_norm(y, x.double() @ w64.t(), tol, what)


def _run_chain(links, x: torch.Tensor) -> list[torch.Tensor]:
    """[x, y1, y2, ...]: every link applied to the previous output, with no op in between."""
    outs = [x]
    for f in links:
        outs.append(f(outs[-1]))
    return outs


def _check_chain(links, w64s, x: torch.Tensor, tol: float) -> None:
    """Eager, then graph replays with fresh inputs; every link checked against its own input."""
    poison_allocator(64 << 20)
    outs = _run_chain(links, x)
    for i, w in enumerate(w64s):
        _close(outs[i + 1], outs[i], w, tol, f"eager link {i}")
    g, gouts = captured(lambda: _run_chain(links, x))
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        for y in gouts[1:]:
            y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for i, w in enumerate(w64s):
            _close(gouts[i + 1], gouts[i], w, tol, f"replay link {i}")


def _kbit_layer(k: int, dtype: torch.dtype, scale: float):
    w = torch.randn(DIM, DIM, device=DEV) * scale
    cb = normal_float_codebook(k).to(DEV)
    packed, absmax = ops.kbit_quantize(w, cb, k)
    pt, at = ops.kbit_repack(packed, absmax, k)
    return pt, at, cb, dequantize_kbit(packed, absmax, cb, k, torch.float64)


@pytest.mark.parametrize("m", (1, 3))
@pytest.mark.parametrize("dtype", DTYPES)
def test_kbit_gemv_chain(m, dtype):
    """Stream-K and cluster GEMVs back to back (the stream-K links share one accumulator; k = 5
    runs another CTA shape than k = 3 and 4)."""
    ks = (3, 4, 3, 5, 4, 5, 4)
    # k = 5's stream-K links where its 160 KB of shared memory fits this GPU (not sm_86 / sm_89)
    sk5 = cuda_ops.gemv_sk_ctas(torch.device(DEV), "fp16", 5, m, DIM, DIM // 32, forced=True) > 0
    paths = tuple("gemv_cluster" if p == "gemv_sk" and k == 5 and not sk5 else p for p, k in zip(
        ("gemv_sk", "gemv_sk", "gemv_cluster", "gemv_sk", "gemv_sk", "gemv_cluster", "gemv_cluster"), ks, strict=True))
    layers = [_kbit_layer(k, dtype, DIM ** -0.5) for k in ks]
    links = [
        (lambda h, p=p, L=L, k=k: cuda_ops.linear_path(h, L[0], L[1], L[2], None, k, DIM, p))
        for p, L, k in zip(paths, layers, ks, strict=True)]
    x = torch.randn(m, DIM, device=DEV, dtype=dtype)
    _check_chain(links, [L[3] for L in layers], x, KBIT_TOL[dtype])


@pytest.mark.parametrize("m", (1, 2))
@pytest.mark.parametrize("dtype", DTYPES)
def test_awq_gemv_chain(m, dtype):
    """awq warp and stream-K GEMVs back to back, group 128."""
    group, paths = 128, ("gemv_warp", "gemv_sk", "gemv_sk", "gemv_warp", "gemv_warp")
    layers = []
    for _ in paths:
        w = torch.randn(DIM, DIM, device=DEV, dtype=dtype) * DIM ** -0.5
        qw, qz, s = quantize_awq_rtn(w, group, scale_dtype=dtype)
        wq, sz = ops.awq_repack(qw, qz, s, group, dtype)
        q = unpack_awq(qw).double()
        z = unpack_awq(qz).double().repeat_interleave(group, dim=0)
        layers.append((wq, sz, ((q - z) * s.double().repeat_interleave(group, dim=0)).t()))
    links = [(lambda h, p=p, L=L: awq_ops.linear_path(h, L[0], L[1], None, group, DIM, p))
             for p, L in zip(paths, layers, strict=True)]
    x = torch.randn(m, DIM, device=DEV, dtype=dtype)
    _check_chain(links, [L[2] for L in layers], x, AWQ_TOL[dtype])


def _kbit_experts(n_exp: int, dim: int, k: int):
    """Stacked tiled kbit experts [E, dim, dim], their codebook and float64 weights."""
    cb = normal_float_codebook(k).to(DEV)
    w = torch.randn(n_exp * dim, dim, device=DEV) * dim ** -0.5
    packed, absmax = ops.kbit_quantize(w, cb, k)
    tiles = [ops.kbit_repack(packed[e * dim:(e + 1) * dim], absmax[e * dim:(e + 1) * dim], k) for e in range(n_exp)]
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64).view(n_exp, dim, dim)
    return torch.stack([t[0] for t in tiles]), torch.stack([t[1] for t in tiles]), cb, w64


def _awq_experts(n_exp: int, dim: int, group: int, dtype: torch.dtype):
    """Stacked repacked awq_orin experts [E, dim, dim] and their float64 weights."""
    wqs, szs, w64s = [], [], []
    for _ in range(n_exp):
        qw, qz, s = quantize_awq_rtn(torch.randn(dim, dim, device=DEV, dtype=dtype) * dim ** -0.5, group,
                                     scale_dtype=dtype)
        wq, sz = ops.awq_repack(qw, qz, s, group, dtype)
        z = unpack_awq(qz).double().repeat_interleave(group, dim=0)
        wqs.append(wq)
        szs.append(sz)
        w64s.append(((unpack_awq(qw).double() - z) * s.double().repeat_interleave(group, dim=0)).t())
    return torch.stack(wqs), torch.stack(szs), torch.stack(w64s)


@pytest.mark.parametrize("rows", [24, 12])
@pytest.mark.parametrize("path", ["kbit gemv_sk", "kbit gemv_slot", "awq gemv"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_gemv_reads_fresh_offsets(dtype, path, rows):
    """The grouped GEMVs launched with PDL (kbit stream-K and slot, awq_orin's) after the kernels that
    write their input and expert offsets. 24 rows over 16 experts give the slot GEMV a slot per
    expert (weights requested before pdl_wait); 12 rows fewer slots than experts (found from the
    offsets)."""
    fmt, kpath = path.split()
    n_exp, in_f = 16, 2048
    if fmt == "kbit":
        k = 4
        pt, at, cb, w64 = _kbit_experts(n_exp, in_f, k)
        tol = KBIT_TOL[dtype]

        def grouped(h: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
            return cuda_ops.grouped_path(h, pt, at, cb, offs, k, in_f, kpath)
    else:
        wq, sz, w64 = _awq_experts(n_exp, in_f, 128, dtype)
        tol = AWQ_TOL[dtype]

        def grouped(h: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
            return awq_ops.grouped_path(h, wq, sz, offs, 128, in_f, kpath)
    counts = torch.zeros(n_exp, dtype=torch.int32, device=DEV)
    x = torch.randn(rows, in_f, device=DEV, dtype=dtype)

    def layer(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        offs = torch.cat([counts.new_zeros(1), counts.cumsum(0, dtype=torch.int32)])  # written just before
        y = grouped(h, offs)
        y2 = grouped(y, offs)  # back to back
        return offs, y, y2

    def check(offs: torch.Tensor, h: torch.Tensor, y: torch.Tensor) -> None:
        want = torch.zeros(rows, in_f, dtype=torch.float64, device=DEV)
        o = offs.tolist()
        for e in range(n_exp):
            want[o[e]:o[e + 1]] = h[o[e]:o[e + 1]].double() @ w64[e].t()
        assert not torch.isnan(y).any()
        err = ((y.double() - want).abs().max() / want.abs().max()).item()
        assert err < tol, f"{path}: max-norm relative error {err:.3g}"

    def new_routing() -> None:
        ids = torch.randint(0, n_exp, (rows,), device=DEV)
        counts.copy_(torch.bincount(ids, minlength=n_exp).to(torch.int32))

    poison_allocator(64 << 20)
    new_routing()
    offs, y, y2 = layer(x)
    check(offs, x, y)
    check(offs, y, y2)
    g, (goffs, gy, gy2) = captured(lambda: layer(x))
    for _ in range(3):
        new_routing()
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        check(goffs, x, gy)
        check(goffs, gy, gy2)
