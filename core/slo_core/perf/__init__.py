"""Performance model: per-iteration batch latency fitted from GPU profiles, with online correction."""
