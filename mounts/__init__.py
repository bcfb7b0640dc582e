"""The host data layout, the ids allowed in its paths and the per-user mount plan (pure), with
the skill store (`skillstore/`) and the no-follow file toolkit (`fs/`) below it."""
