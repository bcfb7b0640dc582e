"""The agent's BUILD id: a hash of its own code.

The host computes it over the package it deploys and the agent over the copy it runs, so
both sides agree exactly when the code is the same (drift detection).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_LENGTH = 16


def source_files(package_dir: Path) -> list[Path]:
    return sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)


def compute_build_id(package_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in source_files(package_dir):
        digest.update(path.relative_to(package_dir).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:BUILD_LENGTH]


@lru_cache(maxsize=1)
def own_build_id() -> str:
    return compute_build_id(PACKAGE_DIR)
