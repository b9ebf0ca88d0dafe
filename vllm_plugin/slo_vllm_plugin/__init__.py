"""slofleet's engine-side scheduler for vLLM (``--scheduler-cls``): the only slofleet code in a vLLM image.

It imports only the standard library, ``slo_core``, ``slo_proto`` and (optionally) grpcio, all of which
vLLM's own environment provides; vLLM itself is imported only by :mod:`.scheduler`.
"""
