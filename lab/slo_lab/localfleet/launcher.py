"""Start, watch and stop the processes of a local fleet: engines, one sidecar each, the router.

Engine mode (the default): the router sends each request straight to its engine (engine-sim, which
schedules like the vLLM plugin) with SLO tags signed by a key generated for this fleet; the engine
reports its view to its sidecar (``--analyzer``), which answers with bounds and serves the router's
state stream. Proxy mode: the router sends to the sidecar, which holds requests and relays to a stock
engine. An engine given by URL (an existing vLLM) is reached through its sidecar in either mode.

Every process is ``python -m slo_core.cli <command>`` (the same commands the Helm chart runs), its
output in ``<workdir>/logs/<name>.log``. Start-up waits for each ``/health``; a process that exits
or never gets healthy stops the whole fleet with the tail of its log. Stopping goes front to back:
router first (no new requests), then the sidecars (SIGTERM: drain), then the engines.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import httpx
import yaml

from slo_core.crd.loads import load_policy, render_policy_config
from slo_core.crd.policy import PolicyRef, SLOPolicy
from slo_core.crd.semantics import policy_spec_problems
from slo_lab.localfleet.spec import EngineGroup, FleetSpec

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health poll is noise here

EXAMPLE_POLICY = "slopolicy-chat-agent.yaml"
START_TIMEOUT_S = 120.0


class FleetError(RuntimeError):
    """The fleet could not start; the message says which process and why."""


def default_policy_file() -> Path:
    """The shipped example SLOPolicy (packaged copy, else the repository's examples/)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "examples" / EXAMPLE_POLICY, here.parents[2] / "examples" / EXAMPLE_POLICY):
        if candidate.is_file():
            return candidate
    raise FleetError(f"the example policy {EXAMPLE_POLICY} is not installed; pass --policy-file PATH")


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PICK_FLOOR = 20000  # ports below the kernel's ephemeral range, above the usual services'
_handed_out: set[int] = set()  # ports this process gave a child that may not have bound them yet
_rng = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port that nothing listens on, for a child to bind a moment later.

    Between this check and the child's bind, any socket the kernel gives an ephemeral port (an
    outgoing connection, a bind to port 0) could take it. So the port is picked below the kernel's
    ephemeral range, where the kernel never hands ports out on its own, at random, never the same
    twice in one process; where that range is empty, the kernel picks (port 0).
    """
    low, _ = _ephemeral_range()
    if low - _PICK_FLOOR >= 1000:
        for _ in range(200):
            port = _rng.randrange(_PICK_FLOOR, low)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    name: str
    url: str
    cmd: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()


@dataclass(frozen=True)
class Pod:
    """One engine with its sidecar, as the router sees it."""

    pod_id: str
    engine_url: str
    sidecar_url: str
    grpc_target: str
    profile: str
    model: str | None
    direct: bool = False  # engine mode: the router sends to the engine, not through the sidecar

    @property
    def serving_url(self) -> str:
        """Where the router sends this pod's requests."""
        return self.engine_url if self.direct else self.sidecar_url


class LocalFleet:
    """A running local fleet (use as a context manager, or call start/stop)."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if spec.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="slofleet-")
            self.workdir = Path(self._tmp.name)
        else:
            self.workdir = spec.workdir
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        source = Path(spec.policy_file) if spec.policy_file else default_policy_file()
        self.policy, self.policy_file = self._effective_policy(source)
        self.children: list[Child] = []
        self.pods: list[Pod] = []
        port = spec.port or free_port(spec.host)
        self.router_url = f"http://{spec.host}:{port}"
        self._router_port = port
        self.tag_key_file: Path | None = None
        if spec.mode == "engine":  # the router signs SLO tags with it, the engines verify them
            self.tag_key_file = self.workdir / "tag-keys"
            self.tag_key_file.write_text(secrets.token_hex(32) + "\n", encoding="utf-8")
            self.tag_key_file.chmod(0o600)

    def _effective_policy(self, source: Path) -> tuple[SLOPolicy, Path]:
        """The policy file every process reads: the source, or a copy with the spec's overrides."""
        policy = load_policy(source)
        if not (self.spec.engine_policy or self.spec.routing_policy):
            return policy, source
        update = {}
        if self.spec.engine_policy:
            update["scheduling"] = PolicyRef(name=self.spec.engine_policy)
        if self.spec.routing_policy:
            update["routing"] = PolicyRef(name=self.spec.routing_policy)
        policy = policy.model_copy(update={"spec": policy.spec.model_copy(update=update)})
        problems = policy_spec_problems(policy.spec)
        if problems:
            raise FleetError("invalid policy override: " + "; ".join(problems))
        path = self.workdir / "policy.yaml"
        path.write_text(render_policy_config(policy), encoding="utf-8")
        return policy, path

    # ---- building the commands --------------------------------------------------------------

    def _cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "slo_core.cli", "--log-level", "WARNING", *args]

    def _engine_child(self, name: str, group: EngineGroup, analyzer: str) -> tuple[Child, str]:
        port = free_port()
        runtime = self.policy.spec.runtime()  # the one runtime form every process uses
        scheduling = runtime.scheduling
        policy = scheduling.name if self.spec.mode == "engine" else "fcfs"
        params = scheduling.kwargs() if self.spec.mode == "engine" else {}
        args = ["engine-sim", "--host", "127.0.0.1", "--port", str(port), "--profile", group.profile]
        args += ["--speedup", repr(group.speedup), "--max-num-seqs", str(group.max_num_seqs)]
        args += ["--policy", policy, "--policy-params", json.dumps(dict(params or {}))]
        args += ["--objective", runtime.objective.model_dump_json()]
        if group.model:
            args += ["--model", group.model]
        if self.spec.mode == "engine":  # reports its view to the sidecar, gets bounds back
            args += ["--analyzer", analyzer]
        if self.tag_key_file is not None:
            args += ["--tag-key-file", str(self.tag_key_file)]
        url = f"http://127.0.0.1:{port}"
        return Child(name, url, self._cmd(*args), self.workdir / "logs" / f"{name}.log"), url

    def _sidecar_child(
        self, name: str, engine_url: str, grpc_port: int, pod: str, group: EngineGroup
    ) -> Child:
        port = free_port()
        state = self.workdir / "state" / name
        state.mkdir(parents=True, exist_ok=True)
        args = ["sidecar", "--host", "127.0.0.1", "--port", str(port), "--engine-url", engine_url]
        args += ["--policy-file", str(self.policy_file), "--grpc-port", str(grpc_port)]
        args += ["--mode", self.spec.mode, "--state-dir", str(state)]
        args += ["--pod", pod, "--profile", group.profile]
        if group.url is None:  # engine-sim runs the profile at --speedup: routers must estimate with that
            args += ["--step-time-correction", repr(1.0 / group.speedup)]
        url = f"http://127.0.0.1:{port}"
        return Child(name, url, self._cmd(*args), self.workdir / "logs" / f"{name}.log")

    def _endpoints_file(self) -> Path:
        doc = {
            "endpoints": [
                {
                    "id": pod.pod_id,
                    "url": pod.serving_url,
                    "grpc": pod.grpc_target,
                    "mode": "engine" if pod.direct else "proxy",
                    **({"models": [pod.model]} if pod.model else {}),
                    "profile": pod.profile,
                }
                for pod in self.pods
            ]
        }
        path = self.workdir / "endpoints.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        return path

    def _router_child(self, endpoints: Path) -> Child:
        args = ["router", "--host", self.spec.host, "--port", str(self._router_port)]
        args += ["--endpoints", str(endpoints), "--policy-file", str(self.policy_file)]
        if self.spec.keys_file:
            args += ["--keys-file", str(self.spec.keys_file)]
        if self.tag_key_file is not None:
            args += ["--tag-key-file", str(self.tag_key_file)]
        return Child("router", self.router_url, self._cmd(*args), self.workdir / "logs" / "router.log")

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        try:
            engines: list[tuple[Child | None, str, EngineGroup]] = []
            index = 0
            for group in self.spec.engines:
                for _ in range(group.count):
                    grpc_port = free_port()
                    if group.url is not None:
                        engines.append((None, group.url, group))
                    else:
                        child, url = self._engine_child(f"engine-{index}", group, f"127.0.0.1:{grpc_port}")
                        child.start(env)
                        self.children.append(child)
                        engines.append((child, url, group))
                    sidecar = self._sidecar_child(
                        f"sidecar-{index}", engines[-1][1], grpc_port, f"pod-{index}", group
                    )
                    sidecar.start(env)
                    self.children.append(sidecar)
                    direct = self.spec.mode == "engine" and group.url is None
                    self.pods.append(
                        Pod(f"pod-{index}", engines[-1][1], sidecar.url, f"127.0.0.1:{grpc_port}",
                            group.profile, group.model, direct)
                    )  # fmt: skip
                    index += 1
            self._wait_healthy(self.children)
            self.pods = [self._with_model(pod) for pod in self.pods]
            router = self._router_child(self._endpoints_file())
            router.start(env)
            self.children.append(router)
            self._wait_healthy([router])
        except BaseException:
            self.stop()
            raise

    def _with_model(self, pod: Pod) -> Pod:
        """The pod with the model name its engine serves (asked from the engine's /v1/models)."""
        if pod.model:
            return pod
        try:
            data = httpx.get(f"{pod.engine_url}/v1/models", timeout=5.0).json()["data"]
            return replace(pod, model=str(data[0]["id"]))
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise FleetError(
                f"{pod.pod_id}: the engine at {pod.engine_url} does not list its model: {exc}"
            ) from None

    def _wait_healthy(self, children: list[Child]) -> None:
        pending = list(children)
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(timeout=1.0) as client:
            while pending:
                for child in list(pending):
                    if not child.alive():
                        raise FleetError(f"{child.name} exited while starting:\n{child.tail()}")
                    try:
                        if client.get(f"{child.url}/health").status_code == 200:
                            pending.remove(child)
                    except httpx.HTTPError:
                        pass
                if pending and time.monotonic() > deadline:
                    names = ", ".join(c.name for c in pending)
                    raise FleetError(
                        f"not healthy after {START_TIMEOUT_S:.0f} s: {names}\n{pending[0].tail()}"
                    )
                if pending:
                    time.sleep(0.2)

    def served_model(self) -> str:
        """The model name clients send (asked from the router's /v1/models)."""
        try:
            data = httpx.get(f"{self.router_url}/v1/models", timeout=5.0).json()["data"]
            return str(data[0]["id"])
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return next((p.model for p in self.pods if p.model), "default")

    def dead(self) -> list[Child]:
        """Children that exited on their own."""
        return [c for c in self.children if not c.alive()]

    def stop(self) -> None:
        order = [c for c in self.children if c.name == "router"]
        order += [c for c in self.children if c.name.startswith("sidecar")]
        order += [c for c in self.children if c.name.startswith("engine")]
        for child in order:
            child.stop(timeout_s=20.0 if child.name.startswith("sidecar") else 10.0)
        self.children = []
        # the tag key is a secret that only the fleet's own processes, now stopped, read: a workdir
        # kept for its logs (the demo's report folder) must not keep it
        if self.tag_key_file is not None:
            self.tag_key_file.unlink(missing_ok=True)

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
