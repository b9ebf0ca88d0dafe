"""One RuntimePolicy, built once from an SLOPolicy, is what the router, the sidecar, the operator and the
simulator run: tiers, tenants, admission, the goodput objective with its weights, and the policy refs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from repo_paths import ROOT

from slo_core.crd.loads import load_policy, render_policy_config
from slo_core.crd.policy import SLOPolicy
from slo_core.gain import Delivery, GainParams
from slo_core.objective import Objective
from slo_core.perf.profiles import load_profile
from slo_core.runtime_policy import AdmissionRule, RuntimePolicy
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.slo import RequestKind, SLOTargets
from slo_operator.policy import policy_config
from slo_router.config import from_policy
from slo_sidecar.config import parse_policy_file

EXAMPLE = ROOT / "examples" / "slopolicy-chat-agent.yaml"


def policy(tmp_path: Path, **spec: object) -> tuple[SLOPolicy, Path]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"].update(spec)
    doc["spec"]["goodput"] = {"name": "tempo", "outputWeight": 5.0, "alpha": 2.0}
    doc["spec"]["admission"] = {"onOverload": "best-effort", "maxWaitS": 12}
    doc["spec"]["scheduling"] = {"name": "gmax", "params": {"frame_steps": 7}}
    doc["spec"]["routing"] = {"name": "go-routing", "params": {"alpha": 0.8}}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_policy(path), path


def test_every_process_reads_the_one_runtime_policy(tmp_path: Path) -> None:
    pol, path = policy(tmp_path)
    rp = pol.spec.runtime()
    assert rp.objective == Objective(
        goodput="tempo", gain=GainParams(output_weight=5.0, alpha=2.0), fairness=pol.spec.fairness
    )
    assert rp.admission == AdmissionRule(
        "best-effort", "best-effort", rp.tiers["best-effort"], max_wait_s=12.0
    )

    router = from_policy(pol.spec)  # the router used to account with default weights
    assert router.objective == rp.objective and router.admission == rp.admission
    assert (router.routing_policy, router.routing_params) == ("go-routing", {"alpha": 0.8})
    assert router.tiers == dict(rp.tiers) and set(router.tenants) == set(rp.tenants)

    sidecar = parse_policy_file(path)
    assert sidecar.objective == rp.objective and sidecar.max_wait_s == 12.0
    assert (sidecar.policy_name, sidecar.policy_params) == ("gmax", {"frame_steps": 7})
    assert sidecar.tiers == dict(rp.tiers)

    rendered = policy_config(yaml.safe_load(render_policy_config(pol)))  # what the operator hands the pods
    assert (rendered.engine_policy, rendered.engine_params) == ("gmax", {"frame_steps": 7})

    sim = FleetSim.from_runtime([ReplicaSpec(load_profile("h100-llama3-8b-tp1"))], rp)
    assert sim.pipeline.admission == rp.admission and sim.router.name == "go-routing"
    assert sim.engines[0].policy.name == "gmax"


def test_the_router_accounts_goodput_with_the_policys_weights(tmp_path: Path) -> None:
    pol, _ = policy(tmp_path)
    config = from_policy(pol.spec)
    slo = SLOTargets(RequestKind.DEADLINE, deadline_s=1.0)
    late = Delivery(slo=slo, arrival_s=0.0, input_tokens=10, token_times_s=(1.5, 2.0), completed=True)
    weighted = config.objective(late)
    default = Objective(goodput="tempo")(late)
    # tempo: w·(w_i·in + w_o·out)·min(1, (D/t)^α) = (10 + 5·2)·(1/2)^2 = 5.0, not (10 + 2·2)·(1/2) = 7.0
    assert weighted == pytest.approx(5.0) and default == pytest.approx(7.0)


def test_runtime_policy_is_frozen_and_checks_its_names() -> None:
    rp = RuntimePolicy()
    with pytest.raises(TypeError):
        rp.tiers["x"] = rp.tiers["standard"]  # type: ignore[index]
    with pytest.raises(ValueError, match="Input should be 'token'"):
        Objective(goodput="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="best-effort tier"):
        AdmissionRule("best-effort")
    with pytest.raises(ValueError, match="defaultTier"):
        RuntimePolicy(default_tier="missing")
