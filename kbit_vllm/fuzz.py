"""Randomized sweep of every kbit_vllm:: op against an independent float64 reference (issue #9).

The reference here decodes the formats from their definitions (bit b of word b holds bit b of a
code; E4M4 = 2^(e-11) (1 + m/16); AWQ nibble slot s holds output AWQ_ORDER[s]) in float64 and
shares no code with formats/ or backends/ beyond that definition, so a bug in either shows up.

One case draws an op, shapes, M, k / group size, dtype, tokens per expert, deterministic mode and
non-finite activations from a seeded generator. On CPU it runs the registered CPU ops; on CUDA it
also runs every kernel path by name (backends/cuda/*.linear_path / grouped_path), so paths the
dispatcher would not pick for that M are covered too. tests/test_fuzz.py runs a short fixed-seed
sweep; scripts/fuzz_long.py the long one on the GPU, writing what it covered.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from . import ops
from .formats import AWQ_ORDER, normal_float_codebook
from .formats.kbit_layout import tiled_bit_position, tiled_word
from .layers.moe_compute import kbit_quantize_experts, kbit_repack_experts

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-4}
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KS = (2, 3, 4, 5)
GROUPS = (32, 64, 128)
OPS = ("kbit_quantize", "kbit_dequantize", "kbit_repack", "kbit_linear", "kbit_grouped_linear",
       "awq_dequantize", "awq_linear", "awq_grouped_linear", "kbit_moe_experts")
GATES = {"silu": lambda t: t / (1 + torch.exp(-t)), "gelu": lambda t: 0.5 * t * (1 + torch.erf(t / math.sqrt(2))),
         "gelu_tanh": lambda t: 0.5 * t * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3)))}


# --- independent float64 reference --------------------------------------------------------------

def _e4m4_value(code: int) -> float:
    e, m = code >> 4, code & 15
    return math.ldexp(1 + m / 16, e - 11) if e > 0 else math.ldexp(m / 16, -10)


# Built on the host with math.ldexp: exact. (torch.pow(2.0, t) on CUDA goes through exp2, which
# is not exact for every integer exponent, and a last-bit-off scale flips the fp32 rounding of
# codebook * scale products that sit on a tie.)
_E4M4_F64 = torch.tensor([_e4m4_value(c) for c in range(256)], dtype=torch.float64)


def ref_e4m4(raw: torch.Tensor) -> torch.Tensor:
    """uint8 E4M4 codes -> float64 from the definition (bias 11, subnormals at e = 0)."""
    return _E4M4_F64.to(raw.device)[raw.to(torch.int64)]


def ref_codes_serialized(packed: torch.Tensor, k: int) -> torch.Tensor:
    """int32 [out, nb*k] bit planes -> int64 codes [out, nb*32]: bit e of word b = bit b of code e."""
    out_f = packed.shape[0]
    w = packed.to(torch.int64).reshape(out_f, -1, k) & 0xFFFFFFFF
    e = torch.arange(32, device=packed.device)
    codes = sum((((w[..., b:b + 1] >> e) & 1) << b) for b in range(k))
    return codes.reshape(out_f, -1)


def ref_codes_tiled(packed_tiled: torch.Tensor, k: int, out_features: int) -> torch.Tensor:
    """Tiled [(nt, nb, k, 128)] -> codes [out, nb*32], bit b of element e at tiled_bit_position(e, b, k)
    of word tiled_word(e, b, k), one bit at a time."""
    nt, nb, _, tn = packed_tiled.shape
    w = packed_tiled.to(torch.int64) & 0xFFFFFFFF  # [nt, nb, k, tn]
    codes = torch.zeros(nt, nb, tn, 32, dtype=torch.int64, device=w.device)
    for b in range(k):
        for e in range(32):
            codes[..., e] |= ((w[:, :, tiled_word(e, b, k), :] >> tiled_bit_position(e, b, k)) & 1) << b
    return codes.permute(0, 2, 1, 3).reshape(nt * tn, nb * 32)[:out_features]


def ref_kbit_weight(codes: torch.Tensor, absmax: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """float64 W [out, in] = codebook[code] * E4M4(absmax of the code's block)."""
    scale = ref_e4m4(absmax).repeat_interleave(32, dim=1)
    return codebook.to(torch.float64)[codes] * scale


def ref_awq_nibbles(q: torch.Tensor) -> torch.Tensor:
    """int32 [rows, cols/8] -> int64 [rows, cols]: slot s (bits 4s..4s+3) of word c = column 8c + AWQ_ORDER[s]."""
    rows, packs = q.shape
    w = q.to(torch.int64) & 0xFFFFFFFF
    out = torch.empty(rows, packs, 8, dtype=torch.int64, device=q.device)
    for s, col in enumerate(AWQ_ORDER):
        out[:, :, col] = (w >> (4 * s)) & 15
    return out.reshape(rows, packs * 8)


def ref_awq_weight(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g: int) -> torch.Tensor:
    """float64 W [out, in] = scales * (q - zero) per group of g input channels."""
    q = ref_awq_nibbles(qweight).to(torch.float64)
    z = ref_awq_nibbles(qzeros).to(torch.float64).repeat_interleave(g, dim=0)
    s = scales.to(torch.float64).repeat_interleave(g, dim=0)
    return ((q - z) * s).t()


def rel_err(y: torch.Tensor, want: torch.Tensor, floor: float = 1e-30) -> float:
    """Max-norm relative error of y against the float64 reference (denominator at least floor)."""
    d = (y.to(torch.float64) - want).abs().max()
    return float(d / want.abs().max().clamp_min(floor))


def in_dtype(w64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """w64 rounded once to dtype (what a dequantize-then-matmul in that dtype multiplies by), in float64."""
    return w64.to(dtype).to(torch.float64)


def linear_wants(x: torch.Tensor, w64: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """[3, m, out]: x @ W^T + bias in float64 with W exact, with W rounded to x's dtype, and the
    typical size of such a sum, |x| @ |W|^T / sqrt(in).

    A kernel passes against either of the first two: the tensor-core and dequantize paths multiply
    by weights in the activation dtype. The third floors the max-norm denominator: where every
    output of a case cancels (one output, short K), rounding errors of a correct kernel (fp16
    partial sums in the GEMV) scale with the terms, not with the tiny result."""
    x64 = x.to(torch.float64).nan_to_num(0, 0, 0)
    b = 0 if bias is None else bias.to(torch.float64)
    typical = x64.abs() @ w64.abs().t() / math.sqrt(max(1, x.shape[-1]))
    return torch.stack([x64 @ w64.t() + b, x64 @ in_dtype(w64, x.dtype).t() + b, typical])


# --- cases ----------------------------------------------------------------------------------------

@dataclass
class Sweep:
    """What a sweep ran: one record per checked (case, path), and the failures."""

    records: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        by: dict[str, dict[str, Any]] = defaultdict(lambda: defaultdict(Counter))
        for r in self.records:
            s = by[f"{r['op']}/{r.get('path', 'op')}"]
            s["n"]["cases"] += 1
            for key in ("k", "group", "dtype", "experts", "deterministic", "nonfinite"):
                if key in r:
                    s[key][str(r[key])] += 1
            for key in ("m", "in", "out", "max_tokens_per_expert"):
                if key in r:
                    s[key + "_range"]["min"] = min(s[key + "_range"].get("min", 1 << 30), r[key])
                    s[key + "_range"]["max"] = max(s[key + "_range"].get("max", 0), r[key])
        return {name: {k: dict(v) for k, v in d.items()} for name, d in sorted(by.items())}


def _name(rec: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in rec.items())


def _grouped_want(x: torch.Tensor, offs: torch.Tensor, ws: list[torch.Tensor],
                  out_f: int) -> tuple[torch.Tensor, list[int]]:
    """float64 grouped linear [3, rows, out] (see linear_wants): rows offs[e]:offs[e+1] of x times expert e's W."""
    want = torch.zeros(3, x.shape[0], out_f, dtype=torch.float64, device=x.device)
    o = offs.tolist()
    for e, w in enumerate(ws):
        want[:, o[e]:o[e + 1]] = linear_wants(x[o[e]:o[e + 1]], w, None)
    return want, o


def _max_tokens(offsets: list[int]) -> int:
    return max(b - a for a, b in zip(offsets[:-1], offsets[1:], strict=True))


def _rand_in(gen: torch.Generator, mult: int, hi: int) -> int:
    """A multiple of mult in [mult, hi], skewed towards small values but reaching hi."""
    choice = int(torch.randint(0, 4, (), generator=gen))
    if choice == 0:
        return mult
    top = max(1, hi // mult)
    n_max = top if choice == 3 else min(top, 8)
    return int(torch.randint(1, n_max + 1, (), generator=gen)) * mult


def _pick(gen: torch.Generator, seq: tuple | list) -> Any:
    return seq[int(torch.randint(0, len(seq), (), generator=gen))]


def _m(gen: torch.Generator, hi: int) -> int:
    """Rows of x: every small M (GEMV / MMA boundaries) and some large ones."""
    return _pick(gen, (1, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 257, hi))


def _weight(gen: torch.Generator, out_f: int, in_f: int, device: str) -> torch.Tensor:
    """Gaussian rows of random scale, some rows or blocks all zero (absmax code 0)."""
    w = torch.randn(out_f, in_f, generator=gen) * torch.rand(out_f, 1, generator=gen) * 3
    if out_f > 2:
        w[int(torch.randint(0, out_f, (), generator=gen))] = 0
    return w.to(device)


def _x(gen: torch.Generator, m: int, in_f: int, dtype: torch.dtype, device: str,
       nonfinite: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, in] and a bool mask of rows holding a NaN / +-Inf (when nonfinite)."""
    x = torch.randn(m, in_f, generator=gen).to(dtype)
    bad = torch.zeros(m, dtype=torch.bool)
    if nonfinite and m > 1:
        for _ in range(int(torch.randint(1, 3, (), generator=gen))):
            r, c = int(torch.randint(0, m, (), generator=gen)), int(torch.randint(0, in_f, (), generator=gen))
            x[r, c] = _pick(gen, (float("nan"), float("inf"), float("-inf")))
            bad[r] = True
    return x.to(device), bad.to(device)


class Runner:
    """Runs cases on one device; CUDA adds every named kernel path."""

    def __init__(self, device: str, gen: torch.Generator, sizes: dict[str, int]) -> None:
        self.device = device
        self.gen = gen
        self.sizes = sizes
        self.sweep = Sweep()
        self.cuda = device.startswith("cuda")

    # --- helpers
    def _check_linear(self, rec: dict[str, Any], y: torch.Tensor, want: torch.Tensor, bad: torch.Tensor,
                      dtype: torch.dtype) -> None:
        """Finite rows within TOL of one of the two references (linear_wants); rows with a non-finite
        x entirely non-finite."""
        name = _name(rec)
        self.sweep.records.append(rec)
        good = ~bad
        if bool(bad.any()) and not bool((~torch.isfinite(y[bad])).all()):
            self.sweep.failures.append(f"{name}: a row with NaN/Inf in x has finite outputs")
        if bool(good.any()):
            yg = y[good]
            if not bool(torch.isfinite(yg).all()):
                self.sweep.failures.append(f"{name}: non-finite outputs in rows with finite x")
                return
            floor = float(want[2][good].max())  # good.any(): never empty here
            err = min(rel_err(yg, want[0][good], floor), rel_err(yg, want[1][good], floor))
            if err > TOL[dtype]:
                self.sweep.failures.append(f"{name}: max-norm relative error {err:.3g} > {TOL[dtype]}")

    def _bias(self, out_f: int, dtype: torch.dtype) -> torch.Tensor | None:
        if not bool(torch.randint(0, 2, (), generator=self.gen)):
            return None
        return (torch.randn(out_f, generator=self.gen) * 0.1).to(dtype).to(self.device)

    def _det(self) -> bool:
        return self.cuda and bool(torch.randint(0, 3, (), generator=self.gen) == 0)

    def _run_det(self, det: bool, fn: Callable[[], torch.Tensor], rec: dict[str, Any]) -> torch.Tensor:
        """fn() under KBIT_VLLM_DETERMINISTIC=det; in deterministic mode a second call must equal the first bitwise."""
        old = os.environ.get("KBIT_VLLM_DETERMINISTIC")
        os.environ["KBIT_VLLM_DETERMINISTIC"] = "1" if det else "0"
        try:
            y = fn()
            if det:
                y2 = fn()
                a, b = torch.nan_to_num(y), torch.nan_to_num(y2)
                if not torch.equal(a, b):
                    diff = a != b
                    rows = diff.reshape(-1, diff.shape[-1]).any(-1).nonzero().flatten()[:8].tolist()
                    self.sweep.failures.append(
                        f"{_name(rec)}: deterministic mode gave different bits on a second call "
                        f"({int(diff.sum())} of {diff.numel()} outputs, max diff "
                        f"{float((a.double() - b.double()).abs().max()):.3g}, rows {rows})")
            return y
        finally:
            if old is None:
                os.environ.pop("KBIT_VLLM_DETERMINISTIC", None)
            else:
                os.environ["KBIT_VLLM_DETERMINISTIC"] = old

    # --- kbit
    def kbit_formats(self) -> None:
        """quantize (nearest scale and codes), dequantize (exact), repack/unrepack (exact, tiled decode)."""
        g, dev = self.gen, self.device
        k, dtype = _pick(g, KS), _pick(g, DTYPES)
        out_f, in_f = _rand_in(g, 1, self.sizes["out"]), _rand_in(g, 32, self.sizes["in"])
        w = _weight(g, out_f, in_f, dev).to(dtype)
        cb = normal_float_codebook(k, dev)
        rec = {"op": "kbit_quantize", "k": k, "dtype": str(dtype).split(".")[-1], "in": in_f, "out": out_f}
        name = _name(rec)
        packed, absmax = ops.kbit_quantize(w, cb, k)
        self.sweep.records.append(rec)
        if self.cuda:  # bit-exact with the CPU op
            p_cpu, a_cpu = ops.kbit_quantize(w.cpu(), cb.cpu(), k)
            if not (torch.equal(packed.cpu(), p_cpu) and torch.equal(absmax.cpu(), a_cpu)):
                self.sweep.failures.append(f"{name}: CUDA quantize differs from the CPU op")
        w64 = w.to(torch.float64)
        amax = w64.reshape(out_f, -1, 32).abs().amax(-1)
        table = ref_e4m4(torch.arange(256, dtype=torch.uint8, device=dev))
        best = (table[None, None, :] - amax[..., None]).abs().amin(-1)
        if bool(((ref_e4m4(absmax) - amax).abs() > best + 1e-12).any()):
            self.sweep.failures.append(f"{name}: an absmax code is not the nearest E4M4 value")
        scale = ref_e4m4(absmax).repeat_interleave(32, dim=1)
        norm = torch.where(scale > 0, w64 / scale.clamp_min(1e-300), torch.zeros_like(w64))
        codes = ref_codes_serialized(packed, k)
        dist = (norm[..., None] - cb.to(torch.float64)).abs()
        chosen = dist.gather(-1, codes[..., None])[..., 0]
        if bool((chosen > dist.amin(-1) + 1e-6).any()):
            self.sweep.failures.append(f"{name}: a code is not the nearest codebook entry of w / scale")
        want = ref_kbit_weight(codes, absmax, cb)
        for dt in DTYPES:
            got = ops.kbit_dequantize(packed, absmax, cb, k, dt)
            self.sweep.records.append({**rec, "op": "kbit_dequantize", "dtype": str(dt).split(".")[-1]})
            if not torch.equal(got, want.to(torch.float32).to(dt)):
                self.sweep.failures.append(f"{name}: kbit_dequantize to {dt} differs from the float64 reference")
        pt, at = ops.kbit_repack(packed, absmax, k)
        self.sweep.records.append({**rec, "op": "kbit_repack"})
        if not torch.equal(ref_codes_tiled(pt, k, out_f), codes):
            self.sweep.failures.append(f"{name}: tiled codes differ from the serialized ones")
        a_rows = at.permute(0, 2, 1).reshape(-1, at.shape[1])
        if not (torch.equal(a_rows[:out_f], absmax) and bool((a_rows[out_f:] == 0).all())
                and bool((ref_codes_tiled(pt, k, a_rows.shape[0])[out_f:] == 0).all())):
            self.sweep.failures.append(f"{name}: tiled absmax wrong or padded rows not zero")
        p2, a2 = ops.kbit_unrepack(pt, at, k, out_f)
        if not (torch.equal(p2, packed) and torch.equal(a2, absmax)):
            self.sweep.failures.append(f"{name}: kbit_unrepack does not invert kbit_repack")

    def kbit_linear(self) -> None:
        g, dev = self.gen, self.device
        k, dtype = _pick(g, KS), _pick(g, DTYPES)
        out_f, in_f = _rand_in(g, 1, self.sizes["out"]), _rand_in(g, 32, self.sizes["in"])
        m = _m(g, self.sizes["m"])
        nonfinite = bool(torch.randint(0, 4, (), generator=g) == 0) and dtype != torch.float32
        cb = normal_float_codebook(k, dev)
        packed, absmax = ops.kbit_quantize(_weight(g, out_f, in_f, dev), cb, k)
        pt, at = ops.kbit_repack(packed, absmax, k)
        w64 = ref_kbit_weight(ref_codes_serialized(packed, k), absmax, cb)
        x, bad = _x(g, m, in_f, dtype, dev, nonfinite)
        bias = self._bias(out_f, dtype)
        want = linear_wants(x, w64, bias)
        rec = {"op": "kbit_linear", "k": k, "dtype": str(dtype).split(".")[-1], "in": in_f, "out": out_f, "m": m,
               "bias": bias is not None, "nonfinite": nonfinite}
        det = self._det()
        orec = {**rec, "path": "op", "deterministic": det}
        y = self._run_det(det, lambda: ops.kbit_linear(x, pt, at, cb, bias, k, out_f), orec)
        self._check_linear(orec, y, want, bad, dtype)
        if self.cuda and dtype != torch.float32:
            from .backends.cuda import ops as cops
            from .backends.cuda.cargs import SUFFIX

            paths = ["mma", "dequant"] + (["gemv", "gemv_cluster"] if m <= 4 else [])
            # the forced stream-K GEMV where it runs here: a CTA's warps of units, and k = 5's 160 KB of
            # shared memory on this GPU (as the GPU tests ask)
            if m <= 4 and cops.gemv_sk_ctas(torch.device(dev), SUFFIX[dtype], k, m, out_f, in_f // 32, forced=True):
                paths.append("gemv_sk")
            if m == 1 and k <= 4 and in_f // 32 <= cops.dispatch.ROWS_MAX_BLOCKS:
                paths.append("gemv_rows")  # the row-slice GEMV (fixed order: deterministic)
            for path in paths:
                # "gemv_sk" forces the stream-K GEMV, whose float atomics vary run to run by design
                # (deterministic mode never picks it); every other path must honour the mode.
                det = self._det() and path != "gemv_sk"
                prec = {**rec, "path": path, "deterministic": det}
                y = self._run_det(det, lambda p=path: cops.linear_path(x, pt, at, cb, bias, k, out_f, p), prec)
                self._check_linear(prec, y, want, bad, dtype)

    def _offsets(self, rows: int, n_exp: int) -> torch.Tensor:
        """Random tokens per expert summing to rows: many experts empty, one may take most rows."""
        mode = int(torch.randint(0, 3, (), generator=self.gen))
        if mode == 0:  # uniform
            idx = torch.randint(0, n_exp, (rows,), generator=self.gen)
        elif mode == 1:  # few active experts
            active = torch.randperm(n_exp, generator=self.gen)[: max(1, n_exp // 4)]
            idx = active[torch.randint(0, len(active), (rows,), generator=self.gen)]
        else:  # one hot expert
            idx = torch.where(torch.rand(rows, generator=self.gen) < 0.8, torch.full((rows,), n_exp - 1),
                              torch.randint(0, n_exp, (rows,), generator=self.gen))
        counts = torch.bincount(idx, minlength=n_exp)
        offs = torch.zeros(n_exp + 1, dtype=torch.int64)
        offs[1:] = counts.cumsum(0)
        return offs.to(_pick(self.gen, (torch.int32, torch.int64)))

    def _grouped_inputs(self, rows: int, n_exp: int, in_f: int, out_f: int, dtype: torch.dtype, nonfinite: bool,
                        ws: list[torch.Tensor], rec: dict[str, Any]) -> tuple[Any, ...]:
        """Routing, activations, float64 references and the record of a grouped case whose experts'
        weights (ws, float64 [out, in] each) are drawn."""
        offs = self._offsets(rows, n_exp).to(self.device)
        x, bad = _x(self.gen, rows, in_f, dtype, self.device, nonfinite)
        want, o = _grouped_want(x, offs, ws, out_f)
        rec = {**rec, "in": in_f, "out": out_f, "m": rows, "experts": n_exp, "max_tokens_per_expert": _max_tokens(o),
               "nonfinite": nonfinite}
        return offs, x, bad, want, rec

    def kbit_grouped(self) -> None:
        g, dev = self.gen, self.device
        k, dtype = _pick(g, KS), _pick(g, DTYPES)
        out_f, in_f = _rand_in(g, 1, self.sizes["out"] // 2), _rand_in(g, 32, self.sizes["in"] // 2)
        n_exp = _pick(g, (1, 2, 3, 8, 16, 64))
        rows = _pick(g, (0, 1, 2, 4, 7, 16, 33, 100, self.sizes["m"]))
        nonfinite = bool(torch.randint(0, 4, (), generator=g) == 0) and dtype != torch.float32
        cb = normal_float_codebook(k, dev)
        pts, ats, ws = [], [], []
        for _ in range(n_exp):
            p, a = ops.kbit_quantize(_weight(g, out_f, in_f, dev), cb, k)
            pt, at = ops.kbit_repack(p, a, k)
            pts.append(pt), ats.append(at), ws.append(ref_kbit_weight(ref_codes_serialized(p, k), a, cb))
        pt, at = torch.stack(pts), torch.stack(ats)
        offs, x, bad, want, rec = self._grouped_inputs(
            rows, n_exp, in_f, out_f, dtype, nonfinite, ws,
            {"op": "kbit_grouped_linear", "k": k, "dtype": str(dtype).split(".")[-1]})
        det = self._det()
        orec = {**rec, "path": "op", "deterministic": det}
        y = self._run_det(det, lambda: ops.kbit_grouped_linear(x, pt, at, cb, offs, k, out_f), orec)
        self._check_linear(orec, y, want, bad, dtype)
        if self.cuda and dtype != torch.float32:
            from .backends.cuda import ops as cops

            d_offs = cops.device_offsets(offs)
            for path, bm in (("gemv", None), ("gemv_slot", None), ("mma", _pick(g, (None, 16, 32, 64, 128)))):
                det = self._det()
                prec = {**rec, "path": f"{path}{'' if bm is None else f'_bm{bm}'}", "deterministic": det}
                y = self._run_det(det, lambda p=path, b=bm: cops.grouped_path(x, pt, at, cb, d_offs, k, out_f, p, b),
                                  prec)
                self._check_linear(prec, y, want, bad, dtype)

    def kbit_moe(self) -> None:
        """kbit_moe_experts (a MoE layer's routed experts) against a float64 per-token loop; on CUDA also
        its one-kernel path by name wherever it can run (fp16 / bf16, intermediate a multiple of 128)."""
        g, dev = self.gen, self.device
        k, dtype, act = _pick(g, KS), _pick(g, DTYPES), _pick(g, tuple(GATES))
        hidden = _rand_in(g, 32, self.sizes["in"] // 2)
        inter = _rand_in(g, _pick(g, (32, 128)), self.sizes["out"])
        n_exp = _pick(g, (1, 2, 8, 16, 64))
        top_k = min(n_exp, _pick(g, (1, 2, 4, 8)))
        tokens = _pick(g, (0, 1, 2, 3, 5, 8, 17))
        cb = normal_float_codebook(k, dev)
        pt: list[torch.Tensor] = []  # w13 packed, absmax, w2 packed, absmax (tiled, stacked)
        w64: dict[str, list[torch.Tensor]] = {}
        for name, (o, i) in (("w13", (2 * inter, hidden)), ("w2", (hidden, inter))):
            w = torch.stack([_weight(g, o, i, dev) * 0.1 for _ in range(n_exp)])
            packed, absmax = kbit_quantize_experts(w, cb, k, name)
            pt += kbit_repack_experts(packed, absmax, k)
            w64[name] = [ref_kbit_weight(ref_codes_serialized(p, k), a, cb)
                         for p, a in zip(packed, absmax, strict=True)]
        ids = torch.stack([torch.randperm(n_exp, generator=g)[:top_k] for _ in range(tokens)]) if tokens else \
            torch.zeros(0, top_k, dtype=torch.int64)
        if tokens and bool(torch.randint(0, 3, (), generator=g) == 0):
            ids[0, 0] = _pick(g, (-1, n_exp))  # not served here: contributes nothing
        ids = ids.to(_pick(g, (torch.int32, torch.int64))).to(dev)
        w = torch.rand(tokens, top_k, generator=g).to(dev)
        x, _ = _x(g, tokens, hidden, dtype, dev, False)
        want = torch.zeros(tokens, hidden, dtype=torch.float64, device=dev)
        for t in range(tokens):
            for j in range(top_k):
                e = int(ids[t, j])
                if 0 <= e < n_exp:
                    h = w64["w13"][e] @ x[t].to(torch.float64)
                    want[t] += float(w[t, j]) * (w64["w2"][e] @ (GATES[act](h[:inter]) * h[inter:]))
        rec = {"op": "kbit_moe_experts", "k": k, "dtype": str(dtype).split(".")[-1], "in": hidden, "out": inter,
               "m": tokens, "experts": n_exp}
        runs = [("op", lambda: ops.kbit_moe_experts(x, ids, w, None, *pt, cb, k, act))]
        if self.cuda and dtype != torch.float32 and inter % 128 == 0:
            from .backends.cuda.moe_experts import moe_experts_path

            runs.append(("fused", lambda: moe_experts_path(x, ids, w, None, *pt, cb, k, act, path="fused")))
        for path, fn in runs:
            prec = {**rec, "path": path}
            self.sweep.records.append(prec)
            y = fn()
            if not bool(torch.isfinite(y).all()):
                self.sweep.failures.append(f"{_name(prec)}: non-finite outputs")
            elif tokens and (err := rel_err(y, want)) > 2 * TOL[dtype]:  # two GEMMs and the act's rounding
                self.sweep.failures.append(f"{_name(prec)}: max-norm relative error {err:.3g}")

    # --- awq
    def _awq_weight(self, out_f: int, in_f: int, gs: int, sdtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        g = self.gen
        def words(*shape: int) -> torch.Tensor:
            return torch.randint(-2**31, 2**31 - 1, shape, generator=g, dtype=torch.int64).to(torch.int32)

        qweight, qzeros = words(in_f, out_f // 8), words(in_f // gs, out_f // 8)
        scales = (torch.rand(in_f // gs, out_f, generator=g) * 0.02 + 1e-3).to(sdtype)
        return qweight.to(self.device), qzeros.to(self.device), scales.to(self.device)

    def awq(self) -> None:
        g, dev = self.gen, self.device
        gs, dtype = _pick(g, GROUPS), _pick(g, DTYPES)
        sdtype = _pick(g, (torch.float16, torch.bfloat16, torch.float32))
        out_f = _rand_in(g, _pick(g, (8, 16, 64)), self.sizes["out"])
        in_f = _rand_in(g, gs, self.sizes["in"])
        qw, qz, sc = self._awq_weight(out_f, in_f, gs, sdtype)
        w64 = ref_awq_weight(qw, qz, sc, gs)
        rec = {"op": "awq_dequantize", "group": gs, "dtype": str(sdtype).split(".")[-1], "in": in_f, "out": out_f}
        self.sweep.records.append(rec)
        if not torch.equal(ops.awq_dequantize(qw, qz, sc, gs), w64.to(torch.float32).to(sdtype)):
            self.sweep.failures.append(f"{_name(rec)}: awq_dequantize differs from the float64 reference")
        m = _m(g, self.sizes["m"])
        nonfinite = bool(torch.randint(0, 4, (), generator=g) == 0) and dtype != torch.float32
        x, bad = _x(g, m, in_f, dtype, dev, nonfinite)
        bias = self._bias(out_f, dtype)
        want = linear_wants(x, w64, bias)
        wq, sz = ops.awq_repack(qw, qz, sc, gs, dtype)
        rec = {"op": "awq_linear", "group": gs, "dtype": str(dtype).split(".")[-1], "in": in_f, "out": out_f, "m": m,
               "bias": bias is not None, "nonfinite": nonfinite}
        self._check_linear({**rec, "path": "op"}, ops.awq_linear(x, wq, sz, bias, gs, out_f), want, bad, dtype)
        if self.cuda and dtype != torch.float32:
            from .backends.cuda import awq_ops

            paths = ["mma", "dequant"] + (["gemv", "gemv_warp"] if m <= 8 else [])
            if m <= awq_ops.SK_MAX_M and awq_ops.gemv_sk_units(in_f, out_f) >= awq_ops.SK_WARPS:
                paths.append("gemv_sk")
            for path in paths:
                y = awq_ops.linear_path(x, wq, sz, bias, gs, out_f, path)
                self._check_linear({**rec, "path": path}, y, want, bad, dtype)

    def awq_grouped(self) -> None:
        g = self.gen
        gs, dtype = _pick(g, GROUPS), _pick(g, DTYPES)
        out_f = _rand_in(g, _pick(g, (8, 16, 64)), self.sizes["out"] // 2)
        in_f = _rand_in(g, gs, self.sizes["in"] // 2)
        n_exp = _pick(g, (1, 2, 3, 8, 16, 64))
        rows = _pick(g, (0, 1, 2, 4, 7, 16, 33, 100, self.sizes["m"]))
        nonfinite = bool(torch.randint(0, 4, (), generator=g) == 0) and dtype != torch.float32
        wqs, szs, ws = [], [], []
        for _ in range(n_exp):
            qw, qz, sc = self._awq_weight(out_f, in_f, gs, torch.float16)
            wq, sz = ops.awq_repack(qw, qz, sc, gs, dtype)
            wqs.append(wq), szs.append(sz), ws.append(ref_awq_weight(qw, qz, sc, gs))
        wq, sz = torch.stack(wqs), torch.stack(szs)
        offs, x, bad, want, rec = self._grouped_inputs(
            rows, n_exp, in_f, out_f, dtype, nonfinite, ws,
            {"op": "awq_grouped_linear", "group": gs, "dtype": str(dtype).split(".")[-1]})
        self._check_linear({**rec, "path": "op"}, ops.awq_grouped_linear(x, wq, sz, offs, gs, out_f), want, bad, dtype)
        if self.cuda and dtype != torch.float32:
            from .backends.cuda import awq_ops

            d_offs = offs.to(torch.int32).contiguous()
            for path, bm in (("gemv", None), ("mma", _pick(g, (None, 16, 32, 64)))):
                y = awq_ops.grouped_path(x, wq, sz, d_offs, gs, out_f, path, bm)
                self._check_linear({**rec, "path": f"{path}{'' if bm is None else f'_bm{bm}'}"}, y, want, bad, dtype)

    def one(self) -> None:
        """One random case of one random op family."""
        fam = _pick(self.gen, (self.kbit_formats, self.kbit_linear, self.kbit_linear, self.kbit_grouped,
                               self.awq, self.awq_grouped, self.kbit_moe))
        try:
            fam()
        except Exception as e:  # a crash is a failure of the sweep, not of the harness
            self.sweep.failures.append(f"{fam.__name__}: {type(e).__name__}: {e}")


SHORT = {"in": 256, "out": 300, "m": 300}
LONG = {"in": 8192, "out": 12288, "m": 2048}


def run(device: str, seed: int, cases: int | None = None, seconds: float | None = None,
        sizes: dict[str, int] | None = None) -> Sweep:
    """Run `cases` random cases (or as many as fit in `seconds`) on device from seed; returns the Sweep."""
    gen = torch.Generator().manual_seed(seed)
    r = Runner(device, gen, sizes or SHORT)
    start = time.time()
    n = 0
    while (cases is None or n < cases) and (seconds is None or time.time() - start < seconds):
        r.one()
        n += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return r.sweep
