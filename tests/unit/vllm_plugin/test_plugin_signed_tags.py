"""The vLLM plugin schedules only signed SLO tags by their tier: a request that skipped the router with
forged or unsigned tags is scheduled best-effort and counted (the plugin's bridge, no vLLM needed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from repo_paths import ROOT

from slo_core.policies.registry import make_engine_policy
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.keyring import KeyRing
from slo_core.wire.signing import sign
from slo_core.wire.tags import EngineTags
from slo_vllm_plugin.bridge import PolicyBridge
from slo_vllm_plugin.metrics import PluginMetrics

KEY = b"s" * 32
NOW = 1_000_000.0
GOLD = EngineTags(
    targets=SLOTargets(
        RequestKind.LATENCY, ttft_s=0.5, tbt_s=0.05, priority_class="gold", priority_weight=3.0
    ),
    tenant="product",
)


def request(rid: str, extra: dict[str, Any] | None) -> Any:
    return SimpleNamespace(
        request_id=rid,
        sampling_params=SimpleNamespace(extra_args=extra),
        arrival_time=NOW,
        num_prompt_tokens=10,
        max_tokens=16,
        num_output_tokens=0,
        num_computed_tokens=0,
    )


def bridge(keys: list[bytes] | None) -> tuple[PolicyBridge, PluginMetrics]:
    metrics = PluginMetrics(None)
    b = PolicyBridge(
        make_engine_policy("fcfs", {}), clock=lambda: NOW, tag_keys=keys, on_unsigned=metrics.unsigned
    )
    return b, metrics


def test_signed_tags_keep_their_tier_forged_and_unsigned_ones_are_best_effort() -> None:
    b, metrics = bridge([KEY])
    signed = sign(GOLD.to_xargs(), KEY, NOW)
    assert b.view(request("ok", signed), {}).slo.priority_weight == 3.0
    forged = {**GOLD.to_xargs(), "slo_sig": f"{int(NOW)}.{'0' * 64}"}
    unsigned = GOLD.to_xargs()
    other_key = sign(GOLD.to_xargs(), b"x" * 32, NOW)
    raised = {**signed, "slo_priority_weight": 100.0}
    for rid, extra in [("forged", forged), ("unsigned", unsigned), ("other", other_key), ("raised", raised)]:
        view = b.view(request(rid, extra), {})
        assert view.slo.kind is RequestKind.BEST_EFFORT and view.slo.priority_weight <= 1.0, rid
        assert view.tenant == "default"
    assert b.unsigned == 4 and metrics.unsigned_tags == 4
    # no tags at all: best-effort as always, and not counted as an attack
    assert b.view(request("plain", None), {}).slo.kind is RequestKind.BEST_EFFORT
    assert b.unsigned == 4


def test_without_a_key_tags_are_trusted_as_before() -> None:
    b, _ = bridge(None)
    assert b.view(request("r", GOLD.to_xargs()), {}).slo.priority_weight == 3.0


def test_an_unreadable_key_file_fails_closed() -> None:
    b, _ = bridge([])
    assert b.view(request("r", sign(GOLD.to_xargs(), KEY, NOW)), {}).slo.kind is RequestKind.BEST_EFFORT


# ------------------------------------------------------------------------- the signer and its wiring


def test_the_sidecar_signs_the_tags_it_sends_and_drops_clients_slo_args() -> None:
    from sidecars import queued_job, scripted_sidecar

    from slo_core.wire.signing import verify

    sc, _ = scripted_sidecar(mode="engine")
    sc.keys = lambda: KeyRing(KEY)
    body = {"model": "m", "prompt": "x", "vllm_xargs": {"slo_priority_weight": 99.0, "top_k": 5}}
    job = queued_job(sc, "a", body)
    xargs = sc.upstream_body(job)["vllm_xargs"]
    import time

    assert verify(xargs, [KEY], time.time()) is None
    assert xargs["top_k"] == 5 and xargs.get("slo_priority_weight") != 99.0


def test_the_operator_mounts_the_key_for_sidecar_and_plugin_and_the_chart_creates_it() -> None:

    import helm_python as helm
    import yaml

    from slo_operator import render
    from slo_operator.model import view
    from slo_operator.policy import policy_config
    from slo_operator.settings import OperatorSettings

    root = ROOT
    body = yaml.safe_load((root / "examples" / "modeldeployment-llama-8b-h100.yaml").read_text())
    body["metadata"]["uid"] = "u"
    policy = policy_config(yaml.safe_load((root / "examples" / "slopolicy-chat-agent.yaml").read_text()))
    settings = OperatorSettings(priority=1, tag_key_secret="slofleet-tag-key")
    dep = next(c for c in render.children(view(body), policy, settings) if c["kind"] == "Deployment")
    spec = dep["spec"]["template"]["spec"]
    vllm, sidecar = spec["containers"]
    key_file = next(e["value"] for e in vllm["env"] if e["name"] == "SLOFLEET_TAG_KEY_FILE")
    assert f"--tag-key-file={key_file}" in sidecar["args"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "tag-key"]
    assert volume["secret"]["secretName"] == "slofleet-tag-key"
    chart = helm.Chart.load(str(root / "charts" / "slofleet"))
    out = chart.render({}, name="slofleet", namespace="llm")
    (secret,) = [d for d in yaml.safe_load_all(out["slofleet/templates/tag-key-secret.yaml"]) if d]
    assert secret["metadata"]["name"] == "slofleet-tag-key" and secret["data"]["keys"]
    op = next(d for d in yaml.safe_load_all(out["slofleet/templates/operator-deployment.yaml"]) if d)
    env = {e["name"]: e.get("value") for e in op["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SLOFLEET_OPERATOR_TAG_KEY_SECRET"] == "slofleet-tag-key"
