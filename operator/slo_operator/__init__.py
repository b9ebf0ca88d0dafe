"""The kopf operator: renders ModelDeployments and SLOPolicies into Kubernetes objects."""
