"""Sessions server: durable, tree-structured conversation history for AI agents, over gRPC."""


def version() -> str:
    """The installed package's version."""
    from importlib import metadata

    try:
        return metadata.version("sessions")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"
