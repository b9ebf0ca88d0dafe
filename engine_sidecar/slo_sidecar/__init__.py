"""The in-pod scheduler sidecar and the simulated engine server."""
