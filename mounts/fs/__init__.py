"""The host's stdlib-only file toolkit for directories a sandbox can write: no-follow opens on
directory descriptors, write-to-temp-then-rename, tree removal, locks and the rename-swap."""
