"""Generated protobuf and gRPC stubs for the sessions contract."""
