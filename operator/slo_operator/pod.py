"""The engine pod of a ModelDeployment: vLLM with the slofleet scheduler plugin, and the sidecar in front.

The init container copies the plugin (``slo_vllm_plugin``, ``slo_core``, ``slo_proto``: pure Python) from
the slofleet image into a shared volume; vLLM imports it through ``PYTHONPATH`` and loads it with
``--scheduler-cls``.
The plugin's engine policy comes from the policy ConfigMap as environment variables resolved when the
container starts, so a policy edit never changes the pod template (no vLLM restart): the sidecar
hot-reloads the mounted file and new pods pick up the engine policy.
"""

from __future__ import annotations

from typing import Any

from slo_operator import podsettings
from slo_operator.model import ModelDeploymentView
from slo_operator.settings import OperatorSettings

PREDICTOR_DIR = "/etc/slofleet/predictor"  # spec.sidecar.predictor's ConfigMap
SCHEDULER_CLS = "slo_vllm_plugin.scheduler.SLOScheduler"
PLUGIN_SOURCE_DIR = "/opt/slofleet/plugin"  # where the Dockerfile puts the plugin's packages
PLUGIN_MOUNT = "/opt/slofleet/plugin"
PLUGIN_TARGET = "/plugin-out"
POLICY_DIR = "/etc/slofleet/policy"
POLICY_FILE = "policy.yaml"
ENGINE_POLICY_KEY = "engine-policy"
ENGINE_PARAMS_KEY = "engine-policy-params"
ENGINE_OBJECTIVE_KEY = "engine-objective"
STATE_DIR = "/var/lib/slofleet"
TAG_KEY_DIR = "/etc/slofleet/tag-key"
TAG_KEY_FILE = f"{TAG_KEY_DIR}/keys"
_TAG_KEY_MOUNT = {"name": "tag-key", "mountPath": TAG_KEY_DIR, "readOnly": True}
MODEL_CACHE = "/model-cache"
MODEL_PVC_MOUNT = "/models"

# The vLLM container waits in preStop until the sidecar has drained and closed its port (at most the
# drain time), so in-flight requests finish on a live engine.
_WAIT_FOR_SIDECAR = (
    "import socket,sys,time\n"
    "end=time.monotonic()+int(sys.argv[1])\n"
    "while time.monotonic()<end:\n"
    " try:socket.create_connection(('127.0.0.1',int(sys.argv[2])),1).close()\n"
    " except OSError:break\n"
    " time.sleep(1)\n"
)

_RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# The vLLM container meets Pod Security "restricted" too: vLLM needs no root and no capability; it writes
# only to HOME, /tmp and its caches, all emptyDirs here (HF_HOME, VLLM_CACHE_ROOT, TRITON_CACHE_DIR), so
# its root filesystem is read-only. vLLM's image runs as root by default (USER not set), so a fixed
# non-root uid is chosen here; fsGroup makes the volumes writable for it. Where a custom engine image
# needs root (e.g. it installs packages at start), that image is the exception, not the default.
ENGINE_UID = 1000
ENGINE_HOME = "/home/vllm"
_ENGINE_SECURITY = {**_RESTRICTED, "runAsUser": ENGINE_UID, "runAsGroup": ENGINE_UID}
_POD_SECURITY = {
    "runAsNonRoot": True,
    "fsGroup": ENGINE_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
# vLLM's CPU and memory when the ModelDeployment sets none (tokenizers, detokenization, the API server).
DEFAULT_ENGINE_RESOURCES = {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "64Gi"}}


def _http_probe(path: str, port: str, period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _model_arg(md: ModelDeploymentView) -> str:
    src = md.source
    if src.pvc_claim:
        return f"{MODEL_PVC_MOUNT}/{src.pvc_path.strip('/')}".rstrip("/")
    return src.hf_id or src.uri or md.served_name


def engine_args(md: ModelDeploymentView, settings: OperatorSettings) -> list[str]:
    """vLLM's OpenAI server flags: model, parallelism, limits and the slofleet scheduler."""
    args = [
        f"--model={_model_arg(md)}",
        f"--served-model-name={md.served_name}",
        "--host=0.0.0.0",
        f"--port={settings.engine_port}",
        f"--tensor-parallel-size={md.tensor_parallel_size}",
        f"--scheduler-cls={SCHEDULER_CLS}",
    ]
    optional = [
        ("--revision", md.source.hf_revision),
        ("--max-model-len", md.max_model_len),
        ("--dtype", md.dtype),
        ("--gpu-memory-utilization", md.kv_cache_fraction),
        ("--max-num-seqs", md.max_num_seqs),
        ("--max-num-batched-tokens", md.max_num_batched_tokens),
    ]
    args += [f"{flag}={value}" for flag, value in optional if value is not None]
    if md.lora_adapters:
        args += ["--enable-lora", "--lora-modules", *(f"{name}={src}" for name, src in md.lora_adapters)]
    return args + md.extra_args


def _config_env(name: str, key: str, config_map: str) -> dict[str, Any]:
    ref = {"name": config_map, "key": key, "optional": True}
    return {"name": name, "valueFrom": {"configMapKeyRef": ref}}


def _engine_env(md: ModelDeploymentView, settings: OperatorSettings, config_map: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "PYTHONPATH", "value": PLUGIN_MOUNT},
        {"name": "HOME", "value": ENGINE_HOME},
        {"name": "HF_HOME", "value": MODEL_CACHE},
        {"name": "VLLM_CACHE_ROOT", "value": f"{ENGINE_HOME}/.cache/vllm"},
        {"name": "TRITON_CACHE_DIR", "value": f"{ENGINE_HOME}/.triton"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "DO_NOT_TRACK", "value": "1"},
        {"name": "SLOFLEET_ANALYZER", "value": f"127.0.0.1:{settings.sidecar_grpc_port}"},
        # the plugin says when it degrades to stock order: slofleet_plugin_degraded on this port
        {"name": "SLOFLEET_METRICS_PORT", "value": str(settings.plugin_metrics_port)},
        _config_env("SLOFLEET_POLICY", ENGINE_POLICY_KEY, config_map),
        _config_env("SLOFLEET_POLICY_PARAMS", ENGINE_PARAMS_KEY, config_map),
        _config_env("SLOFLEET_OBJECTIVE", ENGINE_OBJECTIVE_KEY, config_map),
    ]
    if settings.tag_key_secret:  # only SLO tags the sidecar signed are scheduled by their tier
        env.append({"name": "SLOFLEET_TAG_KEY_FILE", "value": TAG_KEY_FILE})
    if md.source.hf_token_secret:
        ref = {"name": md.source.hf_token_secret, "key": md.source.hf_token_key}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env


def _engine_container(md: ModelDeploymentView, settings: OperatorSettings, config_map: str) -> dict[str, Any]:
    gpus = {md.gpu_resource: str(md.gpu_count)} if md.gpu_count > 0 else {}
    mounts = [
        {"name": "plugin", "mountPath": PLUGIN_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},  # noqa: S108 - the pod's own memory volume
        {"name": "model-cache", "mountPath": MODEL_CACHE},
        {"name": "engine-home", "mountPath": ENGINE_HOME},
        {"name": "engine-tmp", "mountPath": "/tmp"},  # noqa: S108 - a pod-private emptyDir
    ]
    if md.source.pvc_claim:
        mounts.append({"name": "model-weights", "mountPath": MODEL_PVC_MOUNT, "readOnly": True})
    if settings.tag_key_secret:
        mounts.append(dict(_TAG_KEY_MOUNT))
    wait = ["python3", "-c", _WAIT_FOR_SIDECAR, str(settings.drain_s), str(settings.sidecar_http_port)]
    return {
        "name": "vllm",
        "image": md.engine_image or settings.engine_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": engine_args(md, settings),
        "env": _engine_env(md, settings, config_map),
        "ports": [
            {"name": "engine", "containerPort": settings.engine_port, "protocol": "TCP"},
            {"name": "plugin-metrics", "containerPort": settings.plugin_metrics_port, "protocol": "TCP"},
        ],
        "resources": _engine_resources(md, gpus),
        # Loading weights takes minutes: the startup probe allows up to 30 minutes before liveness applies.
        "startupProbe": _http_probe("/health", "engine", 10, 180),
        "livenessProbe": _http_probe("/health", "engine", 15, 4),
        "readinessProbe": _http_probe("/health", "engine", 5, 3),
        "lifecycle": {"preStop": {"exec": {"command": wait}}},
        "securityContext": dict(_ENGINE_SECURITY),
        "volumeMounts": mounts,
    }


def _engine_resources(md: ModelDeploymentView, gpus: dict[str, str]) -> dict[str, Any]:
    """The ModelDeployment's CPU and memory (else the defaults), plus its GPUs as request and limit."""
    chosen = md.engine_resources or DEFAULT_ENGINE_RESOURCES
    return {
        "requests": {**dict(chosen.get("requests") or {}), **gpus},
        "limits": {**dict(chosen.get("limits") or {}), **gpus},
    }


def peers_service_name(md: ModelDeploymentView) -> str:
    """The headless Service whose DNS name lists the pods' addresses (calibration peers)."""
    return f"{md.name}-peers"


def sidecar_args(md: ModelDeploymentView, settings: OperatorSettings) -> list[str]:
    """``slofleet sidecar`` in engine mode: SLO tags travel in ``vllm_xargs`` to the in-engine scheduler,
    which asks this sidecar's gRPC analyzer for bounds; it drains for the pod's drain time on SIGTERM."""
    args = [
        "sidecar",
        "--host=0.0.0.0",
        f"--port={settings.sidecar_http_port}",
        f"--engine-url=http://127.0.0.1:{settings.engine_port}",
        "--mode=engine",
        f"--policy-file={POLICY_DIR}/{POLICY_FILE}",
        f"--grpc-port={settings.sidecar_grpc_port}",
        f"--metrics-port={settings.sidecar_metrics_port}",  # /metrics off the port the router calls
        # the replicas share the bound calibration: each fetches every other through the headless Service
        f"--calibration-port={settings.sidecar_calibration_port}",
        f"--calibration-peers=dns+http://{peers_service_name(md)}.{md.namespace}.svc:"
        f"{settings.sidecar_calibration_port}",
        f"--state-dir={STATE_DIR}",
        f"--model-name={md.served_name}",
        "--pod=$(POD_NAME)",
        f"--drain-timeout-s={float(settings.drain_s)}",
    ]
    if md.context_length:
        args.append(f"--max-context-tokens={md.context_length}")
    if settings.tag_key_secret:
        args += [f"--tag-key-file={TAG_KEY_FILE}", "--signed-requests"]  # SLO headers only from the router
    if md.predictor is not None:  # a retrained artefact, pinned by its digest
        args += [f"--predictor={PREDICTOR_DIR}/predictor.npz", f"--predictor-sha256={md.predictor[1]}"]
    return args


def _sidecar_container(md: ModelDeploymentView, settings: OperatorSettings) -> dict[str, Any]:
    resources = md.sidecar_resources or {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "4Gi"},
    }
    return {
        "name": "sidecar",
        "image": md.sidecar_image or settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "args": sidecar_args(md, settings),
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [
            {"name": "http", "containerPort": settings.sidecar_http_port, "protocol": "TCP"},
            {"name": "grpc", "containerPort": settings.sidecar_grpc_port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": settings.sidecar_metrics_port, "protocol": "TCP"},
            {"name": "calibration", "containerPort": settings.sidecar_calibration_port, "protocol": "TCP"},
        ],
        "resources": resources,
        "livenessProbe": _http_probe("/health", "http", 10, 3),
        "readinessProbe": _http_probe("/ready", "http", 5, 2),
        "securityContext": dict(_RESTRICTED),
        "volumeMounts": [
            {"name": "policy", "mountPath": POLICY_DIR, "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - a pod-private emptyDir
            *(
                [{"name": "tag-key", "mountPath": TAG_KEY_DIR, "readOnly": True}]
                if settings.tag_key_secret
                else []
            ),
            *([{"name": "predictor", "mountPath": PREDICTOR_DIR, "readOnly": True}] if md.predictor else []),
        ],
    }


def _init_container(settings: OperatorSettings) -> dict[str, Any]:
    return {
        "name": "install-plugin",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["cp", "-R", f"{PLUGIN_SOURCE_DIR}/.", f"{PLUGIN_TARGET}/"],
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": dict(_RESTRICTED),
        "volumeMounts": [{"name": "plugin", "mountPath": PLUGIN_TARGET}],
    }


def _volumes(md: ModelDeploymentView, config_map: str, settings: OperatorSettings) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "plugin", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{8 * md.tensor_parallel_size}Gi"}},
        {"name": "model-cache", "emptyDir": {"sizeLimit": md.cache_size_limit}},
        {"name": "engine-home", "emptyDir": {"sizeLimit": "10Gi"}},
        {"name": "engine-tmp", "emptyDir": {"sizeLimit": "10Gi"}},
        {"name": "policy", "configMap": {"name": config_map}},
        {"name": "state", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
    ]
    if md.predictor is not None:
        volumes.append({"name": "predictor", "configMap": {"name": md.predictor[0]}})
    if md.source.pvc_claim:
        claim = {"claimName": md.source.pvc_claim, "readOnly": True}
        volumes.append({"name": "model-weights", "persistentVolumeClaim": claim})
    if settings.tag_key_secret:
        secret = {"secretName": settings.tag_key_secret, "items": [{"key": "keys", "path": "keys"}]}
        volumes.append({"name": "tag-key", "secret": secret})
    return volumes


def _scheduling(md: ModelDeploymentView) -> dict[str, Any]:
    node_selector = dict(md.node_selector)
    tolerations = list(md.tolerations)
    if md.gpu_count > 0 and not tolerations:
        tolerations.append({"key": md.gpu_resource, "operator": "Exists", "effect": "NoSchedule"})
    out: dict[str, Any] = {}
    if node_selector:
        out["nodeSelector"] = node_selector
    if tolerations:
        out["tolerations"] = tolerations
    return out


def pod_spec(md: ModelDeploymentView, settings: OperatorSettings, config_map: str) -> dict[str, Any]:
    """The engine pod's spec: init container, vLLM, sidecar, volumes, scheduling and drain time, with the
    ModelDeployment's platform settings (:mod:`slo_operator.podsettings`)."""
    spec = {
        "initContainers": [_init_container(settings)],
        "containers": [_engine_container(md, settings, config_map), _sidecar_container(md, settings)],
        "volumes": _volumes(md, config_map, settings),
        "terminationGracePeriodSeconds": settings.drain_s + 30,
        "enableServiceLinks": False,
        # nothing in the pod talks to the Kubernetes API: no token to steal
        "automountServiceAccountToken": False,
        "securityContext": dict(_POD_SECURITY),
        **_scheduling(md),
    }
    return podsettings.apply(spec, md)
