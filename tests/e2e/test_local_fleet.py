"""``slofleet up`` and ``slofleet demo`` end to end: real processes on loopback, the openai client."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def slofleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "slo_core.cli", *args]


def read_until(proc: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    """stdout of ``proc`` up to the line containing ``marker`` (fails with what it printed)."""
    assert proc.stdout is not None
    out: list[str] = []
    deadline = time.monotonic() + timeout_s
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            out.append(line)
            if marker in line:
                return "".join(out)
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.1)
    raise AssertionError(f"no {marker!r} within {timeout_s} s; printed:\n{''.join(out)}")


def test_up_serves_the_snippet_it_prints_and_stops_cleanly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        slofleet("up", "--engines", "2", "--port", "0", "--workdir", str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        printed = read_until(proc, "Ctrl-C", timeout_s=120)
        snippet = re.search(r"Paste into Python:\n\n(.*?)\n\nCtrl-C", printed, re.S)
        assert snippet, printed
        code = snippet.group(1)
        assert "from openai import OpenAI" in code
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip(), "the pasted snippet streamed a reply"
        assert "pod-0" in printed and "pod-1" in printed
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    # every child process of the fleet is gone
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in ps


def test_up_rejects_a_bad_fleet_config_with_a_clear_message(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("engines:\n  - count: 2\n    url: http://gpu-box:8000\n")
    run = subprocess.run(slofleet("up", "--config", str(config)), capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "count: 1" in run.stderr and "url" in run.stderr


def test_demo_replays_both_fleets_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    run = subprocess.run(
        slofleet(
            "demo",
            "--duration",
            "8",
            "--rps",
            "3",
            "--engines",
            "1",
            "--speedup",
            "1",
            "--max-tokens",
            "64",
            "--out",
            str(out),
        ),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| token goodput (ratio of ideal)" in run.stdout
    assert "gmax + go-routing" in run.stdout and "fcfs + round-robin" in run.stdout
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert set(runs) == {"slofleet", "stock"}
    jobs = results["meta"]["jobs"]
    for label in runs:
        counts = runs[label]["counts"]
        # every replayed job ended: completed, rejected or failed explicitly
        assert sum(counts.values()) == jobs, counts
        assert runs[label]["jobs"] == jobs
        assert runs[label]["completed"] > 0
    # the same workload through the simulator, side by side, with the verdict and the host's lag
    assert "Live vs simulated" in run.stdout and "sim" in run.stdout
    verdict = results["meta"]["versus_simulator"]
    assert {"tiers_within", "worst_tier_gap_pts", "ratio_same_way"} <= set(verdict)
    assert set(results["meta"]["simulated"]) == {"slofleet", "stock"}
    for label in runs:
        host = runs[label]["host"]
        assert host["behind_s"] and all(b is not None and b >= 0 for b in host["behind_s"]), host
        assert host["send_lag_p99_s"] >= 0
    for name in ("report.md", "goodput_over_time.png", "attainment_by_tier.png", "latency_cdfs.png"):
        assert (out / name).stat().st_size > 0
