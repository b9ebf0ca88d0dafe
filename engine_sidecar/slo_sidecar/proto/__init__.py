"""Generated gRPC stubs of proto/slofleet.proto (scripts/gen_proto.sh); do not edit."""
