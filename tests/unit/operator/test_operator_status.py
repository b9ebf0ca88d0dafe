"""ModelDeployment status: phases, conditions with reasons, stable transition times; operator settings."""

from __future__ import annotations

import argparse

import pytest

from slo_operator import cli, status
from slo_operator.model import ModelDeploymentView, ModelSource
from slo_operator.settings import OperatorSettings

SETTINGS = OperatorSettings(priority=1)
MD = ModelDeploymentView(
    name="m",
    namespace="llm",
    uid="u",
    generation=4,
    served_name="m",
    source=ModelSource(hf_id="a/b"),
    policy="p",
    replicas=2,
)
OK = status.Blocker(True)
MISSING = status.Blocker(False, "PolicyNotFound", 'SLOPolicy "p" not found')


def deployment(ready: int, updated: int = 2, observed: int = 1, conditions: list | None = None) -> dict:
    return {
        "metadata": {"name": "m", "generation": 1},
        "spec": {"replicas": 2},
        "status": {
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "observedGeneration": observed,
            "conditions": conditions or [],
        },
    }


def conds(obs: status.Observation) -> dict[str, tuple[str, str]]:
    return {t: (s, r) for t, s, r, _ in obs.conditions}


def test_ready_when_every_replica_of_the_current_generation_is_ready() -> None:
    obs = status.observe(MD, OK, deployment(ready=2))
    assert obs.phase == "Ready"
    assert conds(obs) == {
        "Ready": ("True", "ReplicasReady"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "AsExpected"),
    }


@pytest.mark.parametrize(
    "dep", [deployment(ready=1), deployment(ready=2, updated=1), deployment(2, observed=0)]
)
def test_progressing_until_the_rollout_is_complete(dep: dict) -> None:
    obs = status.observe(MD, OK, dep)
    assert obs.phase == "Progressing"
    assert conds(obs)["Progressing"] == ("True", "RollingOut")
    assert conds(obs)["Ready"][0] == "False"


def test_pending_before_the_deployment_exists_and_degraded_without_policy() -> None:
    assert status.observe(MD, OK, None).phase == "Pending"
    obs = status.observe(MD, MISSING, None)
    assert obs.phase == "Degraded"
    assert conds(obs)["Degraded"] == ("True", "PolicyNotFound")
    assert "not found" in next(m for t, _, _, m in obs.conditions if t == "Degraded")


def test_a_stalled_rollout_is_degraded_with_the_deployment_message() -> None:
    stalled = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "slow"}
    ]
    obs = status.observe(MD, OK, deployment(ready=0, conditions=stalled))
    assert obs.phase == "Degraded"
    assert ("Degraded", "True", "RolloutStalled", "slow") in obs.conditions


def test_transition_times_change_only_when_a_condition_flips() -> None:
    first = status.status(MD, status.observe(MD, OK, deployment(1)), SETTINGS, None, "T1")
    again = status.status(MD, status.observe(MD, OK, deployment(1)), SETTINGS, first, "T2")
    assert status.same(first, again)
    ready = status.status(MD, status.observe(MD, OK, deployment(2)), SETTINGS, again, "T3")
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times == {"Ready": "T3", "Progressing": "T3", "Degraded": "T1"}
    assert ready["observedGeneration"] == 4 and ready["readyReplicas"] == 2


def test_endpoints_list_pods_with_addresses_and_readiness() -> None:
    pods = [
        {"metadata": {"name": "m-b"}, "status": {"podIP": "10.0.0.2"}},
        {
            "metadata": {"name": "m-a"},
            "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
        },
        {"metadata": {"name": "m-c"}, "status": {}},
    ]
    assert status.endpoints(pods, SETTINGS) == [
        {"pod": "m-a", "address": "10.0.0.1:8000", "ready": True},
        {"pod": "m-b", "address": "10.0.0.2:8000", "ready": False},
    ]


def test_settings_come_from_the_environment_and_flags_override() -> None:
    env = {
        "SLOFLEET_OPERATOR_NAMESPACES": "a, b",
        "SLOFLEET_OPERATOR_IMAGE": "img:1",
        "SLOFLEET_OPERATOR_DRAIN_S": "60",
    }
    settings = OperatorSettings.from_env(env)
    assert settings.namespaces == ("a", "b") and settings.image == "img:1" and settings.drain_s == 60
    parser = argparse.ArgumentParser()
    cli.register(parser)
    args = parser.parse_args(["--namespace", "c", "--image", "img:2", "--standalone", "--liveness-port", "0"])
    from_flags = cli.settings_from_args(args)
    assert from_flags.namespaces == ("c",) and from_flags.image == "img:2"
    assert from_flags.peering is None and from_flags.liveness_port is None
    with pytest.raises(ValueError, match="drain_s"):
        OperatorSettings.from_env({"SLOFLEET_OPERATOR_DRAIN_S": "soon"})
