"""The skill content store and everything built from it: sources and fingerprints, the
immutable content entries, per-user views, session links and sync, installs, and GC."""
