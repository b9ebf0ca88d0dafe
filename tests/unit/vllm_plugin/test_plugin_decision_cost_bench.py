"""bench/plugin_decision_cost.py times the plugin's decision both ways on the same requests and stops
when the two bridges decide differently."""

from __future__ import annotations

from types import ModuleType

import pytest
from repo_paths import ROOT, load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script(ROOT / "bench" / "plugin_decision_cost.py", "plugin_decision_cost")


def test_both_ways_decide_alike_and_are_timed(bench: ModuleType) -> None:
    m = bench.measure(queued=300, steps=6)
    assert set(m) == {"shipped", "rebuilt", "policy"}
    assert all(v > 0 for v in m.values())
    assert m["policy"] < m["shipped"]  # the bridge's decision includes the policy's


def test_a_different_decision_stops_the_bench(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    real = bench.PolicyBridge.decide
    calls = [0]

    def odd(self: object, *args: object) -> object:
        d = real(self, *args)
        calls[0] += 1
        if calls[0] == 3:  # one bridge's second decision
            return type(d)(admit=tuple(reversed(d.admit)), running_order=d.running_order)
        return d

    monkeypatch.setattr(bench.PolicyBridge, "decide", odd)
    with pytest.raises(SystemExit, match="decided differently"):
        bench.measure(queued=300, steps=6)


def test_a_parent_checkouts_bridge_decides_beside(bench: ModuleType) -> None:
    parent = bench.parent_bridge(ROOT)  # this checkout as its own parent: a bridge loaded from a tree
    assert parent is not bench.PolicyBridge and parent.__name__ == "PolicyBridge"
    m = bench.measure(queued=300, steps=6, parent=parent)
    assert set(m) == {"shipped", "rebuilt", "policy", "parent"}
    assert m["parent"] > 0


def test_a_shape_sets_how_many_run(bench: ModuleType) -> None:
    assert bench.shape("700") == (700, bench.RUNNING)
    assert bench.shape("50:25") == (50, 25)
    m = bench.measure(queued=40, steps=4, running_n=10)
    assert all(v > 0 for v in m.values())
    for queued, running_n in ((40, 40), (40, 0)):  # nothing would wait, or nothing would run
        with pytest.raises(ValueError, match="some must run and some wait"):
            bench.measure(queued=queued, steps=4, running_n=running_n)


def test_the_fitted_line_is_the_least_squares_one(bench: ModuleType) -> None:
    # on a line, the line itself (ms = 0.5 + 0.002 · queued: 0.5 ms and 2 µs a request)
    base, per_us = bench.fit_line([(100, 0.7), (1000, 2.5), (5000, 10.5)])
    assert base == pytest.approx(0.5) and per_us == pytest.approx(2.0)
    # off it, the residuals sum to zero and are orthogonal to the sizes
    points = [(20, 0.6), (400, 1.5), (1000, 2.7), (5000, 10.1)]
    base, per_us = bench.fit_line(points)
    residuals = [t - (base + per_us / 1000.0 * q) for q, t in points]
    assert sum(residuals) == pytest.approx(0.0, abs=1e-12)
    assert sum(q * e for (q, _), e in zip(points, residuals, strict=True)) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="two queue sizes"):
        bench.fit_line([(100, 1.0), (100, 2.0)])
