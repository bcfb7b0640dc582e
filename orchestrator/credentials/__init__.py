"""Per-user credentials kept on the host only and injected by the egress proxy (docs/credentials.md)."""
