"""Generated stubs for sessions.v1 (do not edit; run `make generate`)."""
