"""Adapters to outside services the server calls (summarizer models)."""
