"""Controlled egress: the allow-listing proxy sandboxes reach through their own Unix socket
(docs/egress.md)."""
