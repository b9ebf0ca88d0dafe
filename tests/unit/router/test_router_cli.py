"""``slofleet router`` argument handling: a bad policy or endpoints file is a clear exit code 2."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from slo_router import cli

POLICY = """\
apiVersion: slofleet.io/v1alpha1
kind: SLOPolicy
metadata: {name: p, namespace: team}
spec:
  priorityClasses: [{name: gold, weight: 3}]
  tiers:
    - {name: chat, kind: latency, ttftS: 1, tbtS: 0.1, priorityClass: gold}
    - {name: spare, kind: best-effort, priorityClass: gold}
  defaultTier: chat
  tenants:
    - {name: acme, allowedTiers: [chat], apiKeysSecret: {name: acme-keys, key: keys}, requestsPerSecond: 5}
  admission: {onOverload: best-effort}
  routing: {name: go-routing, params: {alpha: 0.8}}
"""


def args(tmp_path: Path, **kw: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser)
    argv = ["--endpoints", str(tmp_path / "endpoints.yaml")]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return parser.parse_args(argv)


def test_policy_file_becomes_the_router_config(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    config, secrets_ns = cli.load_config(
        args(tmp_path, policy_file=tmp_path / "policy.yaml", affinity="session")
    )
    assert secrets_ns == "team"
    assert config.tenants["acme"].requests_per_s == 5 and config.tenants["acme"].allowed_tiers == ("chat",)
    assert config.key_secrets == {"acme": ("acme-keys", "keys")}
    assert config.routing_policy == "go-routing" and config.routing_params == {"alpha": 0.8}
    assert config.overload_to_best_effort and config.best_effort_tier == "spare"
    assert config.affinity == ("session",)


def test_bad_inputs_exit_2_saying_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "endpoints.yaml").write_text("endpoints: [{url: 'ftp://x'}]\n")
    assert cli.run(args(tmp_path)) == 2
    assert "'url' must be an http(s) URL" in caplog.text
    (tmp_path / "endpoints.yaml").write_text("endpoints: []\n")
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert cli.run(args(tmp_path, routing_policy="nope")) == 2
    assert "unknown router policy 'nope'" in caplog.text


def test_a_named_policy_needs_kubernetes_and_excludes_a_policy_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "endpoints.yaml").write_text("endpoints: []\n")
    with caplog.at_level(logging.ERROR):
        assert cli.run(args(tmp_path, policy_name="chat-agent")) == 2
    assert "--policy-name needs --kubernetes" in caplog.text
    parser = argparse.ArgumentParser()
    cli.register(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--kubernetes", "--policy-name", "a", "--policy-file", "b.yaml"])
    # until the named policy is read, the cluster router starts closed: keys are required
    named = parser.parse_args(["--kubernetes", "--policy-name", "a", "--affinity", "prefix"])
    config, _ = cli.load_config(named)
    assert config.require_keys and not config.tenants
    assert cli.overrides(config, named).affinity == ("prefix",), "CLI overrides apply to each new version"


@pytest.mark.parametrize(("given", "expected"), [(None, cli.KEEP_ALIVE_S), (10, 10)])
def test_the_router_keeps_idle_client_connections_longer_than_clients_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: int | None, expected: float
) -> None:
    # A server that closes an idle connection when the client expires it races the client's next
    # request on it ("server disconnected", a failed call): the front door outlasts the clients' idle
    # expiry (httpx's, which the openai SDK uses) and is told by --keep-alive-s otherwise.
    import httpx
    import uvicorn

    (tmp_path / "endpoints.yaml").write_text("endpoints: [{url: 'http://127.0.0.1:9'}]\n")
    (tmp_path / "policy.yaml").write_text(POLICY)
    seen: dict[str, object] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    extra = {} if given is None else {"keep_alive_s": given}
    assert cli.run(args(tmp_path, policy_file=tmp_path / "policy.yaml", **extra)) == 0
    assert seen["timeout_keep_alive"] == expected
    if given is None:
        client_expiry = httpx.Limits().keepalive_expiry
        assert client_expiry is not None and expected > 10 * client_expiry
        assert expected > 60  # common load balancers' idle timeout
