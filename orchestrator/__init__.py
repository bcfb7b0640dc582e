"""Sandbox Orchestrator: per-user sandboxes for multi-user AI agents."""

__version__ = "0.1.0"
