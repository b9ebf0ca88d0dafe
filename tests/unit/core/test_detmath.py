"""slo_core.detmath: exp/log/log1p within an ulp or two of the C library's, the scalar twins bit-equal
to the array forms, and the same bits whichever of numpy's CPU kernels the process runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from repo_paths import ROOT

from slo_core import detmath

_SPECIAL = [
    0.0,
    -0.0,
    math.inf,
    -math.inf,
    math.nan,
    -1.0,
    1.0,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    1e-300,
    1e308,
    709.782712893384,
    709.7827128933839,
    709.79,
    -745.1332191019411,
    -745.14,
    -708.4,
    800.0,
    -800.0,
    0.5 * math.log(2.0),
    -0.5 * math.log(2.0),
    math.sqrt(0.5),
    math.sqrt(2.0),
]


def _ulps(got: float, want: float) -> float:
    if (math.isnan(got) and math.isnan(want)) or got == want:
        return 0.0
    if math.isinf(want) or math.isinf(got):
        return math.inf
    return abs(got - want) / math.ulp(want)


def _inputs(kind: str) -> np.ndarray:
    rng = np.random.default_rng(7)
    if kind == "exp":
        parts = [
            rng.uniform(-745.0, 709.78, 40_000),
            rng.normal(0.0, 2.0, 40_000),
            rng.normal(0.0, 1e-9, 2_000),
        ]
    elif kind == "log":
        parts = [
            np.exp(rng.uniform(-744.0, 709.0, 40_000)),
            rng.uniform(0.5, 2.0, 40_000),
            np.arange(1.0, 5_000.0),
        ]
    else:
        parts = [rng.uniform(-1.0, 10.0, 40_000), rng.normal(0.0, 1e-7, 5_000), np.arange(0.0, 5_000.0)]
    return np.concatenate([*parts, np.array(_SPECIAL)])


@pytest.mark.parametrize(
    ("kind", "arr", "scalar", "ref", "max_ulps"),
    [
        ("exp", detmath.exp, detmath.exp_f, math.exp, 1.0),
        ("log", detmath.log, detmath.log_f, math.log, 1.0),
        ("log1p", detmath.log1p, detmath.log1p_f, math.log1p, 2.0),
    ],
)
def test_close_to_the_c_library_and_the_scalar_twin_gives_the_arrays_bits(
    kind: str, arr: object, scalar: object, ref: object, max_ulps: float
) -> None:
    xs = _inputs(kind)
    got = arr(xs)  # type: ignore[operator]
    assert got.dtype == np.float64 and got.shape == xs.shape
    for x, g in zip(xs.tolist(), got.tolist(), strict=True):
        try:
            want = ref(x)  # type: ignore[operator]
        except (ValueError, OverflowError):  # the C library's domain and range errors
            want = {"exp": math.inf, "log": math.nan if x < 0 else -math.inf}.get(kind, math.nan)
            if kind == "log1p" and x == -1.0:
                want = -math.inf
        assert _ulps(g, want) <= max_ulps, (kind, x, g, want)
        twin = scalar(x)  # type: ignore[operator]
        assert twin == g or (math.isnan(twin) and math.isnan(g)), (kind, x, twin, g)
        assert math.copysign(1.0, twin) == math.copysign(1.0, g) or math.isnan(g)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=70), st.data())
def test_each_element_is_the_same_whatever_array_it_is_computed_in(
    xs: list[float], data: st.DataObject
) -> None:
    """Elementwise: a value's bits do not depend on its neighbours, its position or the array's length
    (GMAX concatenates the arguments of several calls into one)."""
    a = np.array(xs)
    i = data.draw(st.integers(0, len(xs) - 1))
    for f in (detmath.exp, detmath.log, detmath.log1p):
        whole = f(a)
        alone = f(a[i : i + 1])
        assert whole[i : i + 1].view(np.int64)[0] == alone.view(np.int64)[0] or (
            math.isnan(whole[i]) and math.isnan(alone[0])
        )
        assert float(f(a[i])) == alone[0] or math.isnan(alone[0])  # a 0-d array too


_DIGEST = """
import hashlib, numpy as np
from slo_core import detmath
x = np.random.default_rng(3).uniform(-30.0, 30.0, 100_000)
parts = (detmath.exp(x), detmath.log(np.abs(x)), detmath.log1p(np.abs(x)), np.exp(x), np.log(np.abs(x)))
print(" ".join(hashlib.sha256(p.tobytes()).hexdigest()[:16] for p in parts))
"""


def _run(code: str, kernels_off: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
    if kernels_off:
        env["NPY_DISABLE_CPU_FEATURES"] = "X86_V4"  # numpy's AVX-512 kernels off: the C library's exp/log
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "core"), str(ROOT / "lab")])
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout


def test_the_same_bits_with_numpys_avx512_kernels_on_and_off() -> None:
    """On an AVX-512 host numpy's own exp/log differ from the C library's on some of these inputs
    (the last two digests); detmath's do not move. Elsewhere both runs take the same kernels."""
    on, off = (_run(_DIGEST, k).split() for k in (False, True))
    assert on[:3] == off[:3]


_GMAX_RUN = """
import json
from slo_core.bench.runner import BenchConfig, run_one_timed
from slo_core.perf import load_profile
from slo_core.workloads import WorkloadSpec
spec = WorkloadSpec(trace="azure-conv-2023", dags="tot", duration_s=40.0, rps=7.0, seed=0)
cfg = BenchConfig(workload=spec, replicas=1, profiles=(load_profile("h100-llama3-8b-tp1"),))
record, _ = run_one_timed(cfg, ("gmax", "round-robin", 7.0))
print(json.dumps({k: v for k, v in record.items() if "wall" not in k}, sort_keys=True, default=str))
"""


def test_a_gmax_simulation_decides_alike_with_numpys_avx512_kernels_on_and_off() -> None:
    """A ToT overload run where numpy's own exp/log made GMAX preempt 28 requests with its AVX-512
    kernels and 18 without (checked before the policy used detmath): now one record either way."""
    on, off = (json.loads(_run(_GMAX_RUN, k)) for k in (False, True))
    assert on["preemptions"] > 0
    assert on == off
