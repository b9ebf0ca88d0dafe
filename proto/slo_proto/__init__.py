"""Generated gRPC stubs of proto/slofleet.proto (scripts/gen_proto.sh); do not edit.

One package imported by every side that speaks the protocol (router, sidecar, vLLM plugin, lab).
"""
