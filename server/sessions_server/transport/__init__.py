"""Transport: gRPC servicers, framing, error mapping, server lifecycle. Mapping only."""
