"""slofleet's engine-side scheduler for vLLM (``--scheduler-cls``), importable inside the vLLM image.

This subpackage imports only the standard library, ``slo_core`` and (optionally) grpcio, all of which
vLLM's own environment provides; vLLM itself is imported only by :mod:`.scheduler`.
"""
