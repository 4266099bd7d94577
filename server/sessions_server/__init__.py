"""Sessions server: durable, tree-structured conversation history for AI agents, over gRPC."""
