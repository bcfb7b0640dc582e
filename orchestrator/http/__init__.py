"""The HTTP API (SPEC §12)."""
