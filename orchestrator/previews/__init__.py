"""Preview URLs: links to a port a sandbox listens on (docs/previews.md)."""
