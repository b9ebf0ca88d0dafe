"""Wire contracts between slofleet components: what travels between router, sidecar and engine."""
