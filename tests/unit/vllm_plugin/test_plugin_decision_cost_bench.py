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
