"""Pure, host-side planning of the data layout, mounts and skill views."""
