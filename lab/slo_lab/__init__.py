"""The lab: everything that runs slofleet without a GPU or a cluster, and nothing a pod needs.

engine-sim (a vLLM-compatible server on simulated GPU time), the local fleet (``slofleet up``), the demo
(``slofleet demo``) and the fakes the tests use. The lab sits above the deployables: it starts them as
processes and may import core, but no product package (operator, router, sidecar, vLLM plugin) imports it.
"""
