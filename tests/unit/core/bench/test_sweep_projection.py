"""bench/sweep_projection.py: a run re-timed at a seed replaces the base's there, a run re-timed at the
base's seed only stands for the seeds not re-timed, and the table reports what was measured."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from repo_paths import ROOT, load_script


@pytest.fixture(scope="module")
def sp() -> ModuleType:
    return load_script(ROOT / "bench" / "sweep_projection.py", "sweep_projection")


def _timing(folder: Path, rows: list[tuple[str, str, float, list[str], float]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    events = [{"event": "start", "runs_total": len(rows)}]
    events += [
        {"event": "run", "file": f, "policy": p, "rps": rps, "objectives": obj, "cpu_s": cpu, "error": None}
        for f, p, rps, obj, cpu in rows
    ]
    events.append(
        {
            "event": "run",
            "file": rows[0][0],
            "policy": "broken",
            "rps": 1.0,
            "objectives": [],
            "cpu_s": 99.0,
            "error": "boom",
        }
    )  # a failed run is no timing
    (folder / "timing.jsonl").write_text("\n".join(map(json.dumps, events)), encoding="utf-8")
    return folder


def test_the_projection_takes_each_seeds_own_timing_where_there_is_one(
    sp: ModuleType, tmp_path: Path
) -> None:
    base = sp.runs(
        _timing(
            tmp_path / "base",
            [
                ("records-tot-r4-s0-token.json", "fcfs", 26.0, ["token", "request"], 10.0),
                ("records-tot-r4-s0-token.json", "gmax", 26.0, ["token"], 100.0),
                ("records-tot-r4-s0-request.json", "gmax", 26.0, ["request"], 200.0),
            ],
        )
    )
    assert base[("tot-r4", 0, "gmax", 26.0, ("token",))] == 100.0 and len(base) == 3
    # gmax re-timed: token at seeds 0 and 1; request at seed 0 only
    over = sp.runs(
        _timing(
            tmp_path / "over",
            [
                ("records-tot-r4-s0-token.json", "gmax", 26.0, ["token"], 40.0),
                ("records-tot-r4-s1-token.json", "gmax", 26.0, ["token"], 50.0),
                ("records-tot-r4-s0-request.json", "gmax", 26.0, ["request"], 60.0),
            ],
        )
    )
    p = sp.project(base, [over], [0, 1, 2])
    assert p["runs"] == 9
    assert p["by_policy"] == {"fcfs": 30.0, "gmax": 40.0 + 50.0 + 40.0 + 3 * 60.0}
    assert p["measured"] == 10.0 + 40.0 + 50.0 + 60.0  # fcfs at seed 0, gmax where timed at its seed
    assert p["total"] == 30.0 + 310.0
    text = sp.table(p, [0, 1, 2], cores=2, bar_h=2.0)
    assert "340 CPU s" in text and "| gmax | 310 | 91.2 % |" in text


def test_a_base_of_several_seeds_is_refused(sp: ModuleType) -> None:
    runs = {("tot-r4", 0, "fcfs", 26.0, ("token",)): 1.0, ("tot-r4", 1, "fcfs", 26.0, ("token",)): 1.0}
    with pytest.raises(ValueError, match="one seed"):
        sp.project(runs, [], [0, 1, 2])


def test_the_committed_base_reproduces_the_thirtieth_pass_projection(sp: ModuleType) -> None:
    sweeps = ROOT / "bench" / "results" / "standard_sweep"
    base = sp.runs(sweeps / "issue20_seed0_30th")
    p = sp.project(base, [sp.runs(sweeps / "issue20_seed0_30th" / "tempo_table")], [0, 1, 2])
    assert p["runs"] == 1134 and round(p["total"]) == 30912  # the README's ~31,000 CPU s
