"""The vLLM plugin builds its engine policy with the SLOPolicy's objective (SLOFLEET_OBJECTIVE)."""

from __future__ import annotations

import logging

import pytest

from slo_core.policies.gmax import GMAX
from slo_vllm_plugin.settings import PluginSettings, load_policy


def test_the_objective_reaches_the_policy() -> None:
    env = {
        "SLOFLEET_POLICY": "gmax",
        "SLOFLEET_POLICY_PARAMS": '{"frame_steps": 20}',
        "SLOFLEET_OBJECTIVE": '{"goodput": "request", "fairness": 0.25}',
    }
    policy = load_policy(PluginSettings.from_env(env))
    assert isinstance(policy, GMAX)
    assert policy.params.goodput == "request"
    assert policy.params.fairness == 0.25
    assert policy.params.frame_steps == 20


def test_without_an_objective_the_policy_keeps_its_defaults() -> None:
    policy = load_policy(PluginSettings.from_env({"SLOFLEET_POLICY": "gmax"}))
    assert isinstance(policy, GMAX) and policy.params.goodput == "token" and policy.params.fairness == 0.0


def test_a_bad_objective_is_a_clear_error_or_fcfs_with_a_log(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="SLOFLEET_OBJECTIVE is not valid JSON"):
        PluginSettings.from_env({"SLOFLEET_OBJECTIVE": "{goodput"})
    with pytest.raises(ValueError, match="must be a JSON object"):
        PluginSettings.from_env({"SLOFLEET_OBJECTIVE": '["token"]'})
    with caplog.at_level(logging.ERROR):
        policy = load_policy(PluginSettings.from_env({"SLOFLEET_OBJECTIVE": '{"goodput": "nope"}'}))
    assert policy.name == "fcfs"
    assert "cannot build policy" in caplog.text
