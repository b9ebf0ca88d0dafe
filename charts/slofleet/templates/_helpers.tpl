{{/* Names, labels and the image shared by every template. */}}

{{- define "slofleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-slofleet, or the release name when it already contains the chart name; 40 characters
leave room for the -operator / -router suffixes within the 63-character label limit. */}}
{{- define "slofleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "slofleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "slofleet.labels" -}}
helm.sh/chart: {{ include "slofleet.chart" . }}
app.kubernetes.io/name: {{ include "slofleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: slofleet
{{- end }}

{{/* Selector labels of one component (operator or router): pass (list $ "operator"). */}}
{{- define "slofleet.selectorLabels" -}}
{{- $root := index . 0 }}
app.kubernetes.io/name: {{ include "slofleet.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "slofleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "slofleet.operatorServiceAccount" -}}
{{- default (printf "%s-operator" (include "slofleet.fullname" .)) .Values.operator.serviceAccount.name }}
{{- end }}

{{- define "slofleet.routerServiceAccount" -}}
{{- default (printf "%s-router" (include "slofleet.fullname" .)) .Values.router.serviceAccount.name }}
{{- end }}

{{/* The namespace the router watches: router.namespace, else the release namespace. */}}
{{- define "slofleet.routerNamespace" -}}
{{- default .Release.Namespace .Values.router.namespace }}
{{- end }}

{{/* Namespaces the operator manages when not cluster-wide: operator.watchNamespaces, else the
release namespace (as a JSON list). */}}
{{- define "slofleet.operatorNamespaces" -}}
{{- if .Values.operator.watchNamespaces }}{{ toJson .Values.operator.watchNamespaces }}{{ else }}{{ list .Release.Namespace | toJson }}{{ end }}
{{- end }}

{{/* The SLOPolicy the router follows: router.policyName, else the chart's default policy. */}}
{{- define "slofleet.routerPolicy" -}}
{{- if .Values.router.policyName }}{{ .Values.router.policyName }}{{ else if .Values.defaultPolicy.enabled }}{{ .Values.defaultPolicy.name }}{{ end }}
{{- end }}

{{/* The kopf peering object (leader election) when the operator runs more than one replica. */}}
{{- define "slofleet.peeringName" -}}
{{- printf "%s-operator" (include "slofleet.fullname" .) }}
{{- end }}

{{/* The operator's permissions on namespaced resources (a ClusterRole's or a Role's rules).
Pass (dict "peering" BOOL "peeringResource" "clusterkopfpeerings"|"kopfpeerings"). */}}
{{- define "slofleet.operatorRules" -}}
# Kubernetes Events for phase transitions.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# ModelDeployments: watched, read fresh, and annotated with kopf's progress.
- apiGroups: ["slofleet.io"]
  resources: ["modeldeployments"]
  verbs: ["get", "list", "watch", "patch"]
# Children carry blockOwnerDeletion owner references: clusters with the OwnerReferencesPermission
# admission plugin (OpenShift) require update on the owner's finalizers for that.
- apiGroups: ["slofleet.io"]
  resources: ["modeldeployments/finalizers"]
  verbs: ["update"]
# SLOPolicies: watched and read, never changed.
- apiGroups: ["slofleet.io"]
  resources: ["slopolicies"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["slofleet.io"]
  resources: ["modeldeployments/status", "slopolicies/status"]
  verbs: ["patch"]
# What a ModelDeployment becomes, applied server-side (an apply creates what is missing); each is read
# first, and one the ModelDeployment does not own is never adopted.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
# An autoscaler targeting the engine Deployment owns its replicas (read only, to leave them alone).
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list"]
# The labels of a ModelDeployment's hfTokenSecret (only Secrets labelled slofleet.io/hf-token=true are
# mounted). No wider than before: whoever may create Deployments may mount any Secret of the namespace.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
# The labels of a ModelDeployment's spec.pod.serviceAccountName (only ServiceAccounts labelled
# slofleet.io/engine-service-account=true run engine pods).
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get"]
{{- if .tagKey }}
# The tag-key Secret: rotated (release namespace) and kept in step (the others), by a replace that
# carries the resourceVersion read; no other Secret is ever written.
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: [{{ .tagKey | quote }}]
  verbs: ["update"]
{{- end }}
# The engine pods' addresses for status.endpoints.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# The scaling loop (replicas.max > replicas.min, no HPA): the replica count through the scale
# subresource, and pod-deletion-cost on the engine pods so a scale-down removes the least-loaded one.
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["patch"]
{{- if .peering }}
# Leader election between replicas by kopf peering (the operator creates its peering object; the
# scaling loop reads it to act only on the active replica).
- apiGroups: ["kopf.dev"]
  resources: [{{ .peeringResource | quote }}]
  verbs: ["get", "list", "watch", "patch", "create"]
{{- end }}
{{- end }}
