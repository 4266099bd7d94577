"""Session semantics, pure: no gRPC, no SQLite."""
