"""``slofleet validate`` (offline tier agreement between the router and ModelDeployments) and the
router's ``--policy-file`` followed live (a ConfigMap update reaches a running router, no restart)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

import yaml
from repo_paths import ROOT

from slo_core.crd.compat import missing_tiers
from slo_core.crd.loads import load_policy
from slo_core.crd.validate import check
from slo_router.app import build_state
from slo_router.config import from_policy
from slo_router.policyfile import follow_policy_file, reload_once
from slo_router.tenants import KeyStore

POLICY = ROOT / "examples" / "slopolicy-chat-agent.yaml"
MD = ROOT / "examples" / "modeldeployment-llama-8b-h100.yaml"


def default_policy(tmp_path: Path) -> Path:
    """The chart's default policy's tiers (interactive, batch, best-effort) as a file named default."""
    doc = yaml.safe_load(POLICY.read_text())
    doc["metadata"]["name"] = "default"
    doc["spec"]["tiers"].append({"name": "interactive", "kind": "best-effort", "priorityClass": "bronze"})
    path = tmp_path / "default.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_missing_tiers_is_what_the_router_sends_and_the_engines_lack() -> None:
    router = {"tiers": [{"name": "interactive"}, {"name": "batch"}]}
    engines = {"tiers": [{"name": "batch"}, {"name": "chat"}]}
    assert missing_tiers(router, engines) == ["interactive"]
    assert missing_tiers(engines, engines) == []


def test_validate_accepts_the_quickstart_and_refuses_tiers_the_pods_lack(
    tmp_path: Path,
) -> None:
    problems, _ = check([POLICY, MD], "chat-agent")
    assert problems == []
    problems, _ = check([POLICY, MD, default_policy(tmp_path)], "default")
    assert len(problems) == 1 and "interactive" in problems[0] and "policyRef" in problems[0]


def test_validate_reports_schema_errors_and_exits_1(tmp_path: Path) -> None:
    bad = yaml.safe_load(MD.read_text())
    bad["spec"]["replicas"] = {"min": -1}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = subprocess.run(
        [sys.executable, "-m", "slo_core.cli", "validate", str(POLICY), str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and "replicas" in proc.stderr
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "slo_core.cli",
            "validate",
            "--router-policy",
            "chat-agent",
            str(POLICY),
            str(MD),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr


def test_the_policy_file_is_reloaded_on_change_and_a_bad_edit_keeps_the_last_good(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.read_text())
    state = build_state(from_policy(load_policy(path).spec), KeyStore(), {})
    assert "interactive" not in state.config.tiers
    seen = reload_once(path, state, None, lambda c: c)
    path.write_text(default_policy(tmp_path).read_text())
    seen = reload_once(path, state, seen, lambda c: c)
    assert "interactive" in state.config.tiers
    path.write_text("spec: {tiers: 3}\n")
    reload_once(path, state, seen, lambda c: c)
    assert "interactive" in state.config.tiers, "the last good policy stays"


async def test_a_running_router_follows_its_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.read_text())
    state = build_state(from_policy(load_policy(path).spec), KeyStore(), {})
    task = asyncio.create_task(follow_policy_file(state, path, every_s=0.05))
    try:
        await asyncio.sleep(0.1)
        path.write_text(default_policy(tmp_path).read_text())
        for _ in range(100):
            if "interactive" in state.config.tiers:
                break
            await asyncio.sleep(0.05)
        assert "interactive" in state.config.tiers
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
