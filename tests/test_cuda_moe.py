"""CUDA grouped (MoE) kernels against float64 references: kbit_grouped_linear, awq_grouped_linear.

Fresh random weights, activations and routing every run (uneven rows per expert, empty experts
at the ends and in between, 1..1024 rows); every kernel path writes into a NaN-poisoned output.
Skips cleanly without a CUDA GPU or a library built for it.

Default mode sums the stream-K GEMV's partial tiles with float atomics, so repeated calls may
differ in the last bits; the grouped MMA's split-K sums run in split order in every mode;
KBIT_VLLM_DETERMINISTIC=1 runs are checked bit for bit.
Error bounds as the dense tests: kbit (max-norm relative) 1e-2 fp16 / 2e-2 bf16 -- the grouped
MMA rounds each weight to the activation dtype (the bf16 pair table rounds the codebook value
once more, < 2^-8 relative), sums in fp32; awq 5e-3 fp16 / 3e-2 bf16 as test_cuda_awq.py.
"""

from __future__ import annotations

import pytest
import torch
from cuda_helpers import at_odd_offset, captured, cuda_kernels_ok

from kbit_vllm import ops
from kbit_vllm.formats import dequantize_kbit, normal_float_codebook, quantize_awq_rtn, unpack_awq

_OK, _WHY = cuda_kernels_ok()
pytestmark = pytest.mark.skipif(not _OK, reason=f"CUDA grouped kernels unavailable: {_WHY}")

if _OK:
    from kbit_vllm.backends.cuda import awq_ops, dispatch
    from kbit_vllm.backends.cuda import ops as cuda_ops

DEV = "cuda"
KS = (2, 3, 4, 5)
DTYPES = (torch.float16, torch.bfloat16)
KBIT_TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
AWQ_TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2}
ROWS = (1, 2, 3, 8, 29, 64, 200, 1024)
KBIT_SHAPES = ((96, 200, 6), (2048, 384, 9))  # (in, out, experts): odd block count + partial tile; split-K
AWQ_SHAPES = ((256, 264, 6), (2048, 136, 5))
KBIT_BMS = (16, 32, 64, 128)
AWQ_BMS = (16, 32, 64)


def _offsets(n_exp: int, rows: int, gen: torch.Generator) -> torch.Tensor:
    """int32 [E + 1] offsets of a skewed random routing; about a third of the experts get no rows,
    always the first one for odd row counts and the last one for even ones."""
    weights = torch.rand(n_exp, generator=gen) ** 3 + 1e-3
    empty = torch.rand(n_exp, generator=gen) < 0.3
    empty[0 if rows % 2 else -1] = True
    weights[empty] = 0
    if weights.sum() == 0:
        weights[n_exp // 2] = 1
    ids = torch.multinomial(weights, rows, replacement=True, generator=gen)
    counts = torch.bincount(ids, minlength=n_exp)
    return torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32).to(DEV)


def _reference(x: torch.Tensor, w64: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """float64 y with rows offs[e]:offs[e+1] through expert e's weight w64[e] [out, in]."""
    y = torch.zeros(x.shape[0], w64.shape[1], dtype=torch.float64, device=x.device)
    o = offs.tolist()
    for e in range(w64.shape[0]):
        if o[e + 1] > o[e]:
            y[o[e]:o[e + 1]] = x[o[e]:o[e + 1]].double() @ w64[e].t()
    return y


def _check(y: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    assert y.shape == want.shape, what
    assert not torch.isnan(y).any(), f"{what}: unwritten (NaN) outputs"
    err = float((y.double() - want).abs().max() / want.abs().max().clamp_min(1e-6))
    assert err < tol, f"{what}: max-norm relative error {err:.3g}"


def _poisoned(rows: int, out_f: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((rows, out_f), float("nan"), dtype=dtype, device=DEV)


def _kbit_experts(n_exp: int, out_f: int, in_f: int, k: int):
    """Stacked tiled weights (packed_t, absmax_t), the codebook and the float64 dequantized W [E, out, in]."""
    w = torch.randn(n_exp * out_f, in_f, device=DEV) * torch.rand(n_exp * out_f, 1, device=DEV)
    cb = normal_float_codebook(k).to(DEV)
    packed, absmax = ops.kbit_quantize(w, cb, k)  # bit-exact with formats.quantize_kbit (test_cuda_kbit)
    w64 = dequantize_kbit(packed, absmax, cb, k, torch.float64).view(n_exp, out_f, in_f)
    tiles = [ops.kbit_repack(packed[e * out_f:(e + 1) * out_f], absmax[e * out_f:(e + 1) * out_f], k)
             for e in range(n_exp)]
    return torch.stack([t[0] for t in tiles]), torch.stack([t[1] for t in tiles]), cb, w64


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_f,out_f,n_exp", KBIT_SHAPES)
def test_kbit_grouped_all_paths(k, dtype, in_f, out_f, n_exp, gen):
    pt, at, cb, w64 = _kbit_experts(n_exp, out_f, in_f, k)
    for rows in ROWS:
        offs = _offsets(n_exp, rows, gen)
        x = torch.randn(rows, in_f, device=DEV, dtype=dtype)
        want = _reference(x, w64, offs)
        runs = [("gemv", {}), ("gemv_sk", {}), ("gemv_slot", {})] + [("mma", {"bm": bm}) for bm in KBIT_BMS]
        runs += [("gemv_sk", {"mp": mp}) for mp in range(1, cuda_ops.GSK_MAX_ROWS + 1)]  # each rows-per-pass
        if cuda_ops.wgmma_ok(DEV, k):
            runs += [("wgmma", {"bm": r}) for r in cuda_ops.WGMMA_ALL_ROW_TILES]  # the Hopper kernel, each row tile
        if dtype == torch.bfloat16:
            runs.append(("dequant", {}))  # every expert dequantized + torch's grouped GEMM (bf16 prefill)
        for path, kw in runs:
            y = cuda_ops.grouped_path(x, pt, at, cb, offs, k, out_f, path, out=_poisoned(rows, out_f, dtype), **kw)
            _check(y, want, KBIT_TOL[dtype], f"rows={rows} {path} {kw} offsets={offs.tolist()}")
        y = ops.kbit_grouped_linear(x, pt, at, cb, offs, k, out_f)  # the op's own dispatch
        _check(y, want, KBIT_TOL[dtype], f"rows={rows} op")


@pytest.mark.parametrize("rgpc,wk", ((1, 1), (4, 1), (2, 2), (4, 2), (1, 4), (2, 4), (1, 8), (2, 8), (1, 16)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_kbit_slot_gemv_every_grid(rgpc, wk, dtype, gen, monkeypatch):
    """The slot GEMV on each (row groups a CTA, warps along K) grid ops.grouped_gemv_config can pick
    (forced), on skewed routings of 5-31 rows: passes of 1, 2 and 4 rows and partial last passes,
    whose sums the row group's warps take (row m by warp m mod WK: several rows a warp where WK is
    below the pass rows), on outputs poisoned first."""
    monkeypatch.setattr(cuda_ops, "grouped_gemv_config", lambda *_: (rgpc, wk))
    in_f, out_f, n_exp = 2048, 264, 5  # 64 blocks: every warp count along K gets work; a partial row group
    pt, at, cb, w64 = _kbit_experts(n_exp, out_f, in_f, 4)
    for rows in (5, 10, 20, 31):
        offs = _offsets(n_exp, rows, gen)
        x = torch.randn(rows, in_f, device=DEV, dtype=dtype)
        y = cuda_ops.grouped_path(x, pt, at, cb, offs, 4, out_f, "gemv_slot", out=_poisoned(rows, out_f, dtype))
        _check(y, _reference(x, w64, offs), KBIT_TOL[dtype], f"rows={rows} rgpc={rgpc} wk={wk} offsets={offs.tolist()}")


@pytest.mark.parametrize("one_cta", (False, True))
@pytest.mark.parametrize("dtype", DTYPES)
def test_kbit5_grouped_wgmma_tables(one_cta, dtype, gen, monkeypatch):
    """k = 5's grouped wgmma on each pair table, whatever the grid (dispatch.grouped_wgmma_one_cta
    forced): 32 copies at one CTA per SM, 8 at two; each row tile, split-K and not, on outputs
    poisoned first."""
    if not cuda_ops.wgmma_ok(DEV, 5):
        pytest.skip("wgmma needs compute capability 9.0 and an sm_90a library")
    monkeypatch.setattr(dispatch, "grouped_wgmma_one_cta", lambda *_: one_cta)
    for in_f, out_f, n_exp in KBIT_SHAPES:
        pt, at, cb, w64 = _kbit_experts(n_exp, out_f, in_f, 5)
        for rows in (3, 64, 200):
            offs = _offsets(n_exp, rows, gen)
            x = torch.randn(rows, in_f, device=DEV, dtype=dtype)
            want = _reference(x, w64, offs)
            for r in cuda_ops.WGMMA_ALL_ROW_TILES:
                y = cuda_ops.grouped_path(x, pt, at, cb, offs, 5, out_f, "wgmma", bm=r,
                                          out=_poisoned(rows, out_f, dtype))
                _check(y, want, KBIT_TOL[dtype], f"rows={rows} bm={r} one_cta={one_cta}")


@pytest.mark.parametrize("k", (3, 4))
@pytest.mark.parametrize("dtype", DTYPES)
def test_kbit_grouped_deterministic_mode(k, dtype, gen, monkeypatch):
    """KBIT_VLLM_DETERMINISTIC=1: the slot GEMV and the fixed-order split-K MMA and wgmma, right and
    same bits."""
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "1")
    in_f, out_f, n_exp = 2048, 384, 9
    pt, at, cb, w64 = _kbit_experts(n_exp, out_f, in_f, k)
    for rows in (3, 64, 200):
        offs = _offsets(n_exp, rows, gen)
        x = torch.randn(rows, in_f, device=DEV, dtype=dtype)
        want = _reference(x, w64, offs)
        wg = [("wgmma", 16), ("wgmma", 64), ("wgmma", 128)] if cuda_ops.wgmma_ok(DEV, k) else []
        for path, bm in [("gemv", None), ("gemv_sk", None)] + [("mma", bm) for bm in KBIT_BMS] + wg:
            first = cuda_ops.grouped_path(x, pt, at, cb, offs, k, out_f, path, bm=bm,
                                          out=_poisoned(rows, out_f, dtype))
            _check(first, want, KBIT_TOL[dtype], f"rows={rows} {path} bm={bm}")
            for _ in range(3):
                again = cuda_ops.grouped_path(x, pt, at, cb, offs, k, out_f, path, bm=bm)
                assert torch.equal(again, first), f"rows={rows} {path} bm={bm}: not deterministic"


@pytest.mark.parametrize("k", (2, 4, 5))
def test_kbit_grouped_gemv_bf16_rows_of_mixed_magnitude(k, gen):
    """bf16 x whose rows span 2^-14 .. 2^14 in scale (and reach past fp16's range): the stream-K and
    slot GEMVs turn bf16 x into fp16 times a power of two per staged row, so each row is checked on
    its own (a scale mixed up between rows or items shows as a wrong or overflowed row)."""
    in_f, out_f, n_exp = 1024, 384, 9
    pt, at, cb, w64 = _kbit_experts(n_exp, out_f, in_f, k)
    for rows in (1, 17, 200, 500):  # 200 and 500 rows give the staged kernel (gsx_wins) at most widths
        offs = _offsets(n_exp, rows, gen)
        mag = torch.pow(2.0, torch.randint(-14, 15, (rows, 1), generator=gen).float()).to(DEV)
        x = (torch.randn(rows, in_f, device=DEV) * mag).to(torch.bfloat16)
        want = _reference(x, w64, offs)
        runs = [("gemv_sk", {"mp": mp}) for mp in range(1, cuda_ops.GSK_MAX_ROWS + 1)] + [("gemv_slot", {}), ("op", {})]
        for path, kw in runs:
            if path == "op":
                y = ops.kbit_grouped_linear(x, pt, at, cb, offs, k, out_f)
            else:
                y = cuda_ops.grouped_path(x, pt, at, cb, offs, k, out_f, path,
                                          out=_poisoned(rows, out_f, torch.bfloat16), **kw)
            assert torch.isfinite(y).all(), f"rows={rows} {path} {kw}: non-finite outputs"
            err = (y.double() - want).abs().amax(dim=1) / want.abs().amax(dim=1).clamp_min(1e-30)
            assert float(err.max()) < KBIT_TOL[torch.bfloat16], (
                f"rows={rows} {path} {kw}: per-row relative error {err.tolist()} offsets={offs.tolist()}")


def test_kbit_grouped_many_experts_int64_offsets_fp32(gen):
    """> 128 experts (the offsets scan takes several rounds), int64 offsets, fp32 x (reference)."""
    k, in_f, out_f, n_exp = 3, 64, 128, 300
    pt, at, cb, w64 = _kbit_experts(n_exp, out_f, in_f, k)
    for rows in (1, 5, 90, 777):
        offs = _offsets(n_exp, rows, gen)
        x = torch.randn(rows, in_f, device=DEV, dtype=torch.float16)
        want = _reference(x, w64, offs)
        wg = (("wgmma", 16), ("wgmma", 64)) if cuda_ops.wgmma_ok(DEV, k) else ()
        for path, bm in (("gemv", None), ("gemv_sk", None), ("gemv_slot", None), ("mma", 16), ("mma", 128), *wg):
            y = cuda_ops.grouped_path(x, pt, at, cb, offs, k, out_f, path, bm=bm,
                                      out=_poisoned(rows, out_f, x.dtype))
            _check(y, want, KBIT_TOL[x.dtype], f"rows={rows} {path} bm={bm}")
        _check(ops.kbit_grouped_linear(x, pt, at, cb, offs.long(), k, out_f), want, KBIT_TOL[x.dtype], "int64")
        y32 = ops.kbit_grouped_linear(x.float(), pt, at, cb, offs, k, out_f)
        assert y32.dtype == torch.float32
        _check(y32, want, 1e-4, "fp32")
    empty = ops.kbit_grouped_linear(torch.empty(0, in_f, device=DEV, dtype=torch.float16), pt, at, cb,
                                    torch.zeros(n_exp + 1, dtype=torch.int32, device=DEV), k, out_f)
    assert empty.shape == (0, out_f)


def _awq_experts(n_exp: int, out_f: int, in_f: int, gs: int, dtype: torch.dtype):
    """Stacked CUDA resident (wq [E, out/8, in], sz [E, G, out, 2]) and float64 W [E, out, in]."""
    wqs, szs, w64 = [], [], []
    for _ in range(n_exp):
        qw, qz, s = quantize_awq_rtn(torch.randn(out_f, in_f, device=DEV), gs, scale_dtype=dtype)
        wq, sz = ops.awq_repack(qw, qz, s, gs, dtype)
        wqs.append(wq)
        szs.append(sz)
        q = unpack_awq(qw).double()
        z = unpack_awq(qz).double().repeat_interleave(gs, dim=0)
        w64.append(((q - z) * s.double().repeat_interleave(gs, dim=0)).t())
    return torch.stack(wqs), torch.stack(szs), torch.stack(w64)


@pytest.mark.parametrize("gs", (32, 64, 128))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_f,out_f,n_exp", AWQ_SHAPES)
def test_awq_grouped_all_paths(gs, dtype, in_f, out_f, n_exp, gen):
    wq, sz, w64 = _awq_experts(n_exp, out_f, in_f, gs, dtype)
    for rows in ROWS:
        offs = _offsets(n_exp, rows, gen)
        x = torch.randn(rows, in_f, device=DEV, dtype=dtype)
        want = _reference(x, w64, offs)
        runs = [("gemv", None)] + [("mma", bm) for bm in AWQ_BMS]
        if cuda_ops.wgmma_ok(DEV, 4):
            runs += [("wgmma", r) for r in cuda_ops.WGMMA_ALL_ROW_TILES]  # the Hopper kernel, each row tile
        if dtype == torch.bfloat16:
            runs.append(("dequant", None))  # every expert dequantized in one launch + torch's grouped GEMM
        for path, bm in runs:
            y = awq_ops.grouped_path(x, wq, sz, offs, gs, out_f, path, bm=bm, out=_poisoned(rows, out_f, dtype))
            _check(y, want, AWQ_TOL[dtype], f"rows={rows} {path} bm={bm} offsets={offs.tolist()}")
        y = ops.awq_grouped_linear(x, wq, sz, offs, gs, out_f)
        _check(y, want, AWQ_TOL[dtype], f"rows={rows} op")


@pytest.mark.parametrize("rows", (1, 8, 200))
def test_grouped_weights_at_unaligned_offset(rows, gen):
    """Stacked expert weights that are views at a 4-byte (not 16-byte) offset: both grouped ops
    copy them before any kernel's 16-byte loads and match the float64 reference."""
    dtype = torch.bfloat16
    pt, at, cb, w64 = _kbit_experts(6, 200, 96, 4)
    wq, sz, a64 = _awq_experts(5, 264, 256, 64, dtype)
    for n_exp, run, ref64, tol, what in (
        (6, lambda x, o: ops.kbit_grouped_linear(x, at_odd_offset(pt), at_odd_offset(at), cb, o, 4, 200), w64,
         KBIT_TOL[dtype], "kbit"),
        (5, lambda x, o: ops.awq_grouped_linear(x, at_odd_offset(wq), at_odd_offset(sz), o, 64, 264), a64,
         AWQ_TOL[dtype], "awq"),
    ):
        offs = _offsets(n_exp, rows, gen)
        x = torch.randn(rows, ref64.shape[2], device=DEV, dtype=dtype)
        _check(run(x, offs), _reference(x, ref64, offs), tol, f"{what} rows={rows} unaligned weights")


def _graph_check(run, x: torch.Tensor, offs: torch.Tensor, n_exp: int, gen: torch.Generator,
                 exact: bool = True) -> None:
    """Capture run() once, then replay under new activations and a new routing written in place:
    the replay must equal an eager call, bit for bit where the reductions run in a fixed order
    (exact), else to 1e-2 (float-atomic sums; every replay must still be right, so the kernels'
    accumulators and counters are left zeroed)."""
    run()
    g, y = captured(run, warmups=2)
    for _ in range(3):
        offs.copy_(_offsets(n_exp, x.shape[0], gen))
        x.copy_(torch.randn_like(x))
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        eager = run()
        if exact:
            assert torch.equal(y, eager), f"replay differs from eager (rows={x.shape[0]})"
        else:
            err = float((y.double() - eager.double()).abs().max() / eager.double().abs().max())
            assert err < 1e-2, f"replay differs from eager by {err:.3g} (rows={x.shape[0]})"


@pytest.mark.parametrize("deterministic", (True, False))
@pytest.mark.parametrize("rows", (6, 64, 700))
def test_kbit_grouped_graph_replay(rows, deterministic, gen, monkeypatch):
    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "1" if deterministic else "0")
    n_exp, in_f, out_f, k = 16, 1024, 256, 4
    pt, at, cb, _ = _kbit_experts(n_exp, out_f, in_f, k)
    x = torch.randn(rows, in_f, device=DEV, dtype=torch.float16)
    offs = _offsets(n_exp, rows, gen)
    _graph_check(lambda: ops.kbit_grouped_linear(x, pt, at, cb, offs, k, out_f), x, offs, n_exp, gen,
                 exact=deterministic)


@pytest.mark.parametrize("deterministic", (True, False))
def test_grouped_dequant_path_dispatch_and_graph_replay(deterministic, gen, monkeypatch):
    """bf16 with more than dispatch.GROUPED_DEQUANT_MIN_ROWS expected rows per expert (where the
    grouped wgmma runs: GROUPED_DEQUANT_MIN_ROWS_WGMMA, kbit's GROUPED_DEQUANT_MIN_ROWS_WGMMA_KBIT):
    the kbit and awq ops take the dequantize + grouped GEMM path, right, captured and replayed in a
    CUDA graph; fp16 keeps the grouped MMA (or, on Hopper, the grouped wgmma)."""
    from kbit_vllm.backends.cuda import dispatch, grouped_mm

    monkeypatch.setenv("KBIT_VLLM_DETERMINISTIC", "1" if deterministic else "0")
    n_exp, in_f, out_f, k, rows = 4, 1024, 384, 4, 12288
    assert dispatch.choose_grouped_path(rows, n_exp, (9, 0)) == "mma"
    assert grouped_mm.prefers_dequant(rows, n_exp, torch.bfloat16, (9, 0), out_f)
    assert grouped_mm.prefers_dequant(rows, n_exp, torch.bfloat16, (9, 0), out_f, wgmma=True)
    assert grouped_mm.prefers_dequant(rows, n_exp, torch.bfloat16, (9, 0), out_f, wgmma=True, kbit=True)
    assert not grouped_mm.prefers_dequant(rows, 8, torch.bfloat16, (9, 0), out_f, wgmma=True)  # 1536 per expert
    assert not grouped_mm.prefers_dequant(rows, 16, torch.bfloat16, (9, 0), out_f, wgmma=True, kbit=True)  # 768
    assert not grouped_mm.prefers_dequant(rows, n_exp, torch.float16, (9, 0), out_f)
    assert not grouped_mm.grouped_mm_ok(torch.bfloat16, (9, 0), 100)  # rows of 200 bytes: not 16-aligned
    pt, at, cb, w64 = _kbit_experts(n_exp, out_f, in_f, k)
    x = torch.randn(rows, in_f, device=DEV, dtype=torch.bfloat16)
    offs = _offsets(n_exp, rows, gen)
    _check(ops.kbit_grouped_linear(x, pt, at, cb, offs, k, out_f), _reference(x, w64, offs),
           KBIT_TOL[torch.bfloat16], "op (dequant path)")
    _graph_check(lambda: ops.kbit_grouped_linear(x, pt, at, cb, offs, k, out_f), x, offs, n_exp, gen,
                 exact=deterministic)
    wq, sz, w64a = _awq_experts(n_exp, out_f, in_f, 128, torch.bfloat16)  # awq_orin takes the same rule
    _check(ops.awq_grouped_linear(x, wq, sz, offs, 128, out_f), _reference(x, w64a, offs),
           AWQ_TOL[torch.bfloat16], "awq op (dequant path)")
    _graph_check(lambda: ops.awq_grouped_linear(x, wq, sz, offs, 128, out_f), x, offs, n_exp, gen)


@pytest.mark.parametrize("rows", (6, 64, 700))
def test_awq_grouped_graph_replay(rows, gen):
    n_exp, in_f, out_f, gs = 16, 1024, 256, 128
    wq, sz, _ = _awq_experts(n_exp, out_f, in_f, gs, torch.bfloat16)
    x = torch.randn(rows, in_f, device=DEV, dtype=torch.bfloat16)
    offs = _offsets(n_exp, rows, gen)
    _graph_check(lambda: ops.awq_grouped_linear(x, wq, sz, offs, gs, out_f), x, offs, n_exp, gen)
