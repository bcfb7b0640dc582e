"""Tools a run may call: their registry, the identity table, and dispatch."""
