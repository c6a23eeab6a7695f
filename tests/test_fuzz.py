"""Short fixed-seed randomized sweep of every op against the float64 reference in kbit_vllm/fuzz.py
(issue #9): shapes, M, k, dtypes, AWQ group sizes, tokens per expert, NaN/Inf activations.

CPU: the registered CPU ops, a few seconds. CUDA (skipped without a GPU the library serves): the
same sweep through the ops and every named kernel path, both deterministic modes. The long mode
for the device is scripts/fuzz_long.py.
"""

from __future__ import annotations

import pytest
from cuda_helpers import cuda_kernels_ok

from kbit_vllm import fuzz

SEEDS = (0, 1)


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_cpu(seed: int) -> None:
    sweep = fuzz.run("cpu", seed, cases=60)
    ops_seen = {r["op"] for r in sweep.records}
    assert ops_seen == set(fuzz.OPS) - {"kbit_unrepack"}, ops_seen
    assert not sweep.failures, "\n".join(sweep.failures[:20])


_OK, _WHY = cuda_kernels_ok()


@pytest.mark.skipif(not _OK, reason=f"CUDA kernels unavailable: {_WHY}")
@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_cuda(seed: int) -> None:
    sweep = fuzz.run("cuda", seed, cases=60)
    paths = {f"{r['op']}/{r.get('path')}" for r in sweep.records}
    assert {"kbit_linear/mma", "kbit_linear/dequant", "awq_linear/mma"} <= paths, paths
    assert not sweep.failures, "\n".join(sweep.failures[:20])
