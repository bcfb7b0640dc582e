"""Durable collaboration between sessions (SPEC §11, seed 003): ask another session, get the
reply back, never replay the uncertain."""
