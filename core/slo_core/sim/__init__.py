"""Discrete-event engine and fleet simulator, workloads and metrics."""
