"""slofleet as a Gateway API Inference Extension endpoint picker (Envoy ext_proc v3)."""
