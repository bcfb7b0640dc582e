"""Durable collaboration between sessions (docs/collaboration.md): ask another session, get the
reply back, never replay the uncertain."""
