"""The chart's quickstart, replayed literally: every command of the README block, in order, must work and
the last one (curl through the router) must answer 200.

Where no cluster exists the test plays the parts Kubernetes would: the emulated API server (with the real
kubectl and the real Helm library) stores objects; the operator runs with the settings the chart renders;
the "kubelet" starts each engine pod's containers as local processes (engine-sim for vLLM, the real
sidecar with the arguments the operator rendered and the policy file the operator's ConfigMap holds) and
reports the pod Ready; `kubectl create <kind>` is sent as JSON (kubectl builds the object, the emulator
cannot decode protobuf); `kubectl port-forward` becomes the router process itself, run with the arguments
of the chart's router Deployment and a kubeconfig for the router's ServiceAccount. Pod networking is the
one stand-in: every pod is 127.0.0.1, so the operator's pod ports are set to free loopback ports.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import pytest
import yaml
from kube.harness import Cluster, OperatorThread
from repo_paths import ROOT

from slo_lab.localfleet.launcher import Child, free_port
from slo_operator import cli
from slo_operator.cli import operate

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHART = ROOT / "charts" / "slofleet"
OPERATOR_TOKEN, ROUTER_TOKEN = "qs-operator-token", "qs-router-token"


def quickstart(path: Path) -> list[str]:
    """The commands of the ```bash block after ``<!-- quickstart -->``, continuation lines joined."""
    text = path.read_text(encoding="utf-8")
    block = text.split("<!-- quickstart -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def helm_values(argv: list[str]) -> tuple[str, str, str, dict[str, Any]]:
    """(release, chart path, namespace, values) of a ``helm install`` command line (--set a.b=v, {x,y})."""
    assert argv[:2] == ["helm", "install"], argv
    release, chart = argv[2], argv[3]
    namespace, values = "default", {}
    rest = argv[4:]
    while rest:
        flag = rest.pop(0)
        if flag in ("-n", "--namespace"):
            namespace = rest.pop(0)
        elif flag == "--set":
            key, raw = rest.pop(0).split("=", 1)
            value: Any = raw[1:-1].split(",") if raw.startswith("{") else yaml.safe_load(raw)
            node = values
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        else:
            raise AssertionError(f"the replay does not know helm flag {flag}")
    return release, chart, namespace, values


def rendered(values: dict[str, Any], release: str, namespace: str) -> list[dict[str, Any]]:
    out = helm.Chart.load(str(CHART)).render(values, name=release, namespace=namespace)
    return [
        d for p, t in sorted(out.items()) if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d
    ]


def container(docs: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == deployment]
    return dep["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def replace_arg(args: list[str], flag: str, value: str) -> list[str]:
    return [f"{flag}={value}" if a.startswith(flag + "=") else a for a in args]


def cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "slo_core.cli", "--log-level", "INFO", *args]


def wait_healthy(child: Child, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert child.alive(), f"{child.name} exited:\n{child.tail()}"
        try:
            if httpx.get(f"{child.url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{child.name} never became healthy:\n{child.tail()}")


class Replay:
    """Runs the quickstart's commands; plays kubelet and port-forward where no cluster exists."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster, self.workdir = cluster, workdir
        self.children: list[Child] = []
        self.operator: OperatorThread | None = None
        self.docs: list[dict[str, Any]] = []
        self.namespace = "default"
        self.ports = {"sidecar_http_port": free_port(), "sidecar_grpc_port": free_port()}
        self.ports["sidecar_metrics_port"] = free_port()  # the router binds the chart's metrics port
        self.ports["engine_port"] = free_port()
        self.ports["sidecar_calibration_port"] = free_port()
        self.forwarded: dict[str, str] = {}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")},
            "PYTHONUNBUFFERED": "1",
            "HOME": str(workdir),
        }

    def close(self) -> None:
        for child in reversed(self.children):
            child.stop(10)
        if self.operator is not None:
            self.operator.stop()

    def _child(self, name: str, url: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        child = Child(name, url, argv, self.workdir / f"{name}.log")
        child.start(env or self.env)
        self.children.append(child)
        return child

    def run(self, line: str) -> str:
        background = line.endswith("&")
        argv = shlex.split(line.rstrip("&"))
        if argv[0] == "helm":
            return self.helm(argv)
        if argv[0] == "slofleet":
            proc = subprocess.run(
                cmd(*argv[1:]), cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=60
            )
            assert proc.returncode == 0, f"{line}\n{proc.stdout}{proc.stderr}"
            return proc.stdout
        if argv[0] == "curl":
            for local, target in self.forwarded.items():
                argv = [a.replace(f"127.0.0.1:{local}", target) for a in argv]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, f"{line}\nexit {proc.returncode}: {proc.stdout}{proc.stderr}"
            return proc.stdout
        assert argv[0] == "kubectl", line
        if "port-forward" in argv:
            assert background, "port-forward blocks: the quickstart must run it in the background"
            return self.port_forward(argv)
        if "wait" in argv:
            self.kubelet()
        if argv[1:].count("create") and "-f" not in argv:
            # kubectl sends generated built-in objects as protobuf, which the emulator cannot decode:
            # let kubectl build the very same object, then send it as JSON
            built = self.cluster.kubectl(*argv[1:], "--dry-run=client", "-o", "json")
            return self.cluster.kubectl("create", "-f", "-", stdin=built)
        return self.cluster.kubectl(*argv[1:], timeout_s=60) if "apply" not in argv else self.apply(argv)

    def apply(self, argv: list[str]) -> str:
        env = {**self.env, "KUBECONFIG": str(self.cluster.kubeconfig())}
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    # ---------------------------------------------------------------------------------- helm

    def helm(self, argv: list[str]) -> str:
        release, chart, namespace, values = helm_values(argv)
        assert (ROOT / chart).resolve() == CHART
        self.namespace = namespace
        config = helm.Config(
            kubeconfig_path=str(self.cluster.kubeconfig()), namespace=namespace, storage_driver="memory"
        )
        config.install(helm.Chart.load(str(CHART)), release, values, namespace=namespace)
        self.docs = rendered(values, release, namespace)
        self.release = release
        # the operator Deployment's pod: its arguments through the real CLI, its environment
        op = container(self.docs, f"{release}-operator")
        parser = __import__("argparse").ArgumentParser()
        cli.register(parser)
        parsed = parser.parse_args(op["args"][2:])
        env = {e["name"]: e["value"] for e in op["env"] if "value" in e}
        settings = cli.OperatorSettings.from_env(env, namespaces=tuple(parsed.namespaces or ()) or None)
        settings = settings.model_copy(update={"liveness_port": None, **self.ports})
        user = f"system:serviceaccount:{namespace}:{release}-operator"
        self.cluster.call(lambda: self.cluster.emulator.users.update({OPERATOR_TOKEN: user}))
        kubeconfig = str(self.cluster.kubeconfig(OPERATOR_TOKEN, "qs-operator"))
        self.operator = OperatorThread(
            lambda stop, ready: operate(settings, stop, ready, kubeconfig=kubeconfig)
        )
        self.operator.start()
        return ""

    # ------------------------------------------------------------------------------ kubelet

    def kubelet(self) -> None:
        """Start every engine pod the operator asked for, as the kubelet would, and report it Ready."""
        ns = self.namespace
        deps = self.cluster.wait_for(
            lambda: [
                d
                for d in json.loads(self.cluster.kubectl("get", "deploy", "-n", ns, "-o", "json"))["items"]
                if d["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by") == "slofleet-operator"
            ],
            timeout_s=20,
            what="the engine Deployment",
        )
        for dep in deps:
            self.start_pod(dep)

    def start_pod(self, dep: dict[str, Any]) -> None:
        ns, name = self.namespace, dep["metadata"]["name"]
        template = dep["spec"]["template"]
        pod_name = f"{name}-0"
        spec = template["spec"]
        vllm = next(c for c in spec["containers"] if c["name"] == "vllm")
        sidecar = next(c for c in spec["containers"] if c["name"] == "sidecar")
        cm_name = next(v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v)
        cm = self.cluster.get("configmap", cm_name, ns)
        assert cm is not None
        policy_file = self.workdir / f"{name}-policy.yaml"
        policy_file.write_text(cm["data"]["policy.yaml"])
        # vLLM -> engine-sim serving the same model name on the same port, with the plugin's policy
        # and, as the plugin, the tag key: only tags the sidecar signed count, analyzer calls carry tokens
        flags = dict(a.split("=", 1) for a in vllm["args"] if a.startswith("--") and "=" in a)
        engine_port = flags["--port"]
        env = {e["name"]: e.get("value") for e in vllm.get("env", [])}
        key_args: tuple[str, ...] = ()
        if env.get("SLOFLEET_TAG_KEY_FILE"):
            (volume,) = [v for v in spec["volumes"] if v["name"] == "tag-key"]
            key_file = self.secret_file(volume["secret"]["secretName"], ns, f"{name}-engine-tag-key")
            key_args = ("--tag-key-file", str(key_file))
        engine = self._child(
            f"{name}-engine",
            f"http://127.0.0.1:{engine_port}",
            cmd(
                "engine-sim", "--host", "127.0.0.1", "--port", engine_port, "--speedup", "20",
                "--model", flags["--served-model-name"], "--policy", cm["data"]["engine-policy"],
                "--policy-params", cm["data"]["engine-policy-params"],
                "--objective", cm["data"]["engine-objective"],
                "--analyzer", f"127.0.0.1:{self.ports['sidecar_grpc_port']}", *key_args,
            ),
        )  # fmt: skip
        state = self.workdir / f"{name}-state"
        state.mkdir(exist_ok=True)
        args = [a.replace("$(POD_NAME)", pod_name) for a in sidecar["args"]]
        args = replace_arg(args, "--host", "127.0.0.1")
        args = replace_arg(args, "--policy-file", str(policy_file))
        args = replace_arg(args, "--state-dir", str(state))
        for vol in spec["volumes"]:  # Secret volumes: the kubelet writes the Secret's keys as files
            if "secret" in vol and any(a.startswith("--tag-key-file=") for a in args):
                key_file = self.secret_file(vol["secret"]["secretName"], ns, f"{name}-tag-key")
                args = replace_arg(args, "--tag-key-file", str(key_file))
        side = self._child(
            f"{name}-sidecar", f"http://127.0.0.1:{self.ports['sidecar_http_port']}", cmd(*args)
        )
        wait_healthy(engine)
        wait_healthy(side)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "labels": template["metadata"]["labels"],
                "annotations": template["metadata"].get("annotations", {}),
            },
            "spec": {"containers": [{"name": c["name"], "image": c["image"]} for c in spec["containers"]]},
        }
        self.cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pod))
        status = {
            "podIP": "127.0.0.1",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        self.cluster.kubectl(
            "patch", "pod", pod_name, "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip
        replicas = int(dep["spec"].get("replicas", 1))
        dep_status = {
            "observedGeneration": dep["metadata"]["generation"],
            **{k: replicas for k in ("replicas", "readyReplicas", "updatedReplicas", "availableReplicas")},
        }
        self.cluster.kubectl(
            "patch", "deployment", name, "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": dep_status}),
        )  # fmt: skip

    # ------------------------------------------------------------------------- port-forward

    def secret_file(self, secret_name: str, namespace: str, file_name: str) -> Path:
        """What the kubelet does for a Secret volume: the Secret's ``keys`` as a file."""
        secret = self.cluster.get("secret", secret_name, namespace)
        assert secret is not None, f"Secret {secret_name} the pod mounts is missing"
        key_file = self.workdir / file_name
        key_file.write_bytes(base64.b64decode(secret["data"]["keys"]))
        return key_file

    def port_forward(self, argv: list[str]) -> str:
        """``kubectl port-forward svc/<router> L:R``: run the router as its Deployment runs it, on L'."""
        target = next(a for a in argv if a.startswith("svc/"))
        assert target == f"svc/{self.release}-router", target
        local = next(a for a in argv if re.fullmatch(r"\d+:\d+", a)).split(":")[0]
        router = container(self.docs, f"{self.release}-router")
        args = router["args"]
        assert args[1] == "router", args
        port = free_port()
        args = replace_arg(replace_arg(args, "--host", "127.0.0.1"), "--port", str(port))
        if any(a.startswith("--tag-key-file=") for a in args):  # the router's gRPC calls need the key
            key_file = self.secret_file(f"{self.release}-tag-key", self.namespace, "router-tag-key")
            args = replace_arg(args, "--tag-key-file", str(key_file))
        user = f"system:serviceaccount:{self.namespace}:{self.release}-router"
        self.cluster.call(lambda: self.cluster.emulator.users.update({ROUTER_TOKEN: user}))
        env = {**self.env, "KUBECONFIG": str(self.cluster.kubeconfig(ROUTER_TOKEN, "qs-router"))}
        child = self._child("router", f"http://127.0.0.1:{port}", cmd(*args[1:]), env)
        wait_healthy(child)
        # the Service sends traffic only to ready routers: wait as the endpoints controller would
        deadline = time.monotonic() + 60
        probe = router["readinessProbe"]["httpGet"]["path"]
        while httpx.get(f"{child.url}{probe}", timeout=2).status_code != 200:
            assert time.monotonic() < deadline, f"the router never became ready:\n{child.tail(40)}"
            assert child.alive(), child.tail(40)
            time.sleep(0.3)
        self.forwarded[local] = f"127.0.0.1:{port}"
        return ""


@pytest.fixture
def replay(tmp_path: Path) -> Iterator[Replay]:
    with Cluster(tmp_path) as cluster:
        r = Replay(cluster, tmp_path)
        try:
            yield r
        finally:
            r.close()


def test_main_readme_and_chart_readme_give_the_same_quickstart() -> None:
    assert quickstart(ROOT / "README.md") == quickstart(CHART / "README.md")


def test_the_quickstart_followed_literally_answers_200(replay: Replay) -> None:
    lines = quickstart(CHART / "README.md")
    assert lines[-1].startswith("curl"), "the quickstart ends with a request"
    out = ""
    for line in lines:
        out = replay.run(line)
    answer = json.loads(out)
    assert answer["choices"][0]["message"]["content"], answer
    # the trust path held: the engine (engine-sim, verifying tags as the vLLM plugin does) believed the
    # tags the sidecar signed, and no gRPC call to the sidecar (router state feed, analyzer) was refused
    engine = next(c for c in replay.children if c.name.endswith("-engine"))
    sidecar = next(c for c in replay.children if c.name.endswith("-sidecar"))
    engine_metrics = httpx.get(f"{engine.url}/metrics", timeout=10).text
    assert re.search(r"^slofleet_engine_sim_unsigned_tags_total\{[^}]*\} 0\.0$", engine_metrics, re.M)
    assert "slofleet_sidecar_grpc_unauthenticated_total{" not in httpx.get(f"{sidecar.url}/metrics").text
    # what the chart printed is the same path: its NOTES name the router's policy for ModelDeployments
    release, _, namespace, values = helm_values(shlex.split(next(x for x in lines if x.startswith("helm"))))
    notes = helm.Chart.load(str(CHART)).render(values, name=release, namespace=namespace)
    text = notes["slofleet/templates/NOTES.txt"]
    policy = values["router"]["policyName"]
    assert f"spec.policyRef: {policy}" in text
    for example in re.findall(r"-f (examples/\S+)", text):
        assert yaml.safe_load((ROOT / example).read_text())["kind"] in ("SLOPolicy", "ModelDeployment")
