"""Where the suite keeps the venvs it builds from pinned requirements (the code kernels' python,
the agent frameworks' venvs): outside the checkout, under a key of what went into each, so every
checkout on the machine (each CI run is a fresh clone) builds one once instead of paying pip
again on every run, as the sandbox image is reused by its recipe and the local cluster's binaries
by their patch set.

As root: /var/lib/sandbox-orchestrator-tests/build-cache (root-owned, 0711 like the tests' shared
root, so the sandbox uids that run the kernel venv's python can traverse it). Otherwise the
checkout's own .cache/ (a user without root runs no sandbox uids)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_CACHE = Path("/var/lib/sandbox-orchestrator-tests/build-cache")


def cache_root() -> Path:
    """The cache directory, made (and kept traversable by sandbox uids) when missing."""
    if os.geteuid() != 0:
        root = REPO / ".cache"
        root.mkdir(mode=0o755, exist_ok=True)
        return root
    for directory in (SHARED_CACHE.parent, SHARED_CACHE):
        directory.mkdir(mode=0o711, exist_ok=True)
        os.chmod(directory, 0o711)
    return SHARED_CACHE


def cache_key(*what: object) -> str:
    """A short name for the inputs of a build (requirements, the base python): another input,
    another directory; an older build is never reused for newer pins."""
    return hashlib.sha256(json.dumps(what, default=str).encode()).hexdigest()[:12]
