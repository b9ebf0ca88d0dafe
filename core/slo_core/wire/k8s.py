"""What the operator writes on Kubernetes objects and the router (and chart) read back.

The operator labels engine pods and annotates their template with how to reach them (engine mode: the
router sends to the engine's port, the sidecar's gRPC port serves the state stream); the router's
discovery selects pods by these labels and reads these annotations. Changing a value here changes both.
"""

from __future__ import annotations

API_GROUP = "slofleet.io"
API_VERSION = "v1alpha1"

ENGINE_NAME = "slofleet-engine"  # app.kubernetes.io/name of every engine pod
NAME_LABEL = "app.kubernetes.io/name"
ENGINE_SELECTOR = f"{NAME_LABEL}={ENGINE_NAME}"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "slofleet-operator"
MD_LABEL = f"{API_GROUP}/model-deployment"  # the ModelDeployment a pod serves
POLICY_LABEL = f"{API_GROUP}/policy"  # the SLOPolicy it follows

ANNOTATION_PREFIX = f"{API_GROUP}/"
SERVED_MODEL_ANNOTATION = ANNOTATION_PREFIX + "served-model"
HTTP_PORT_ANNOTATION = ANNOTATION_PREFIX + "http-port"
GRPC_PORT_ANNOTATION = ANNOTATION_PREFIX + "grpc-port"
CONTEXT_LENGTH_ANNOTATION = ANNOTATION_PREFIX + "context-length"
GPU_CLASS_ANNOTATION = ANNOTATION_PREFIX + "gpu-class"
LORA_ADAPTERS_ANNOTATION = ANNOTATION_PREFIX + "lora-adapters"
# "engine": http-port is the engine's own port (vLLM with the slofleet plugin; requests carry signed SLO
# tags); "proxy" (or absent, as on pods rendered before engine mode): http-port is the sidecar's
MODE_ANNOTATION = ANNOTATION_PREFIX + "mode"
