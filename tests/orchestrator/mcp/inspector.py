"""The MCP Inspector CLI (npm `@modelcontextprotocol/inspector`), installed once into a cache
directory so its tests run offline afterwards: `.ci/run` installs it before the suite; a
developer's first run installs it from the npm registry. Without node/npm (or without the
registry on a first run) its tests skip, unless REQUIRE_MCP_INSPECTOR=1 (CI): then they fail."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

INSPECTOR_VERSION = "2.12.0"
REQUIRED = os.environ.get("REQUIRE_MCP_INSPECTOR") == "1"


def cache_dir() -> Path:
    base = os.environ.get("MCP_INSPECTOR_DIR")
    if base:
        return Path(base)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "sandbox-orchestrator" / f"mcp-inspector-{INSPECTOR_VERSION}"


def installed_bin(install: bool = True) -> tuple[Path | None, str]:
    """The inspector's launcher, installing it first when allowed; or None and why not."""
    launcher = cache_dir() / "node_modules" / ".bin" / "mcp-inspector"
    if launcher.exists():
        return launcher, ""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return None, "node and npm are not installed"
    if not install:
        return None, f"not installed in {cache_dir()}"
    cache_dir().mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache_dir()), f"@modelcontextprotocol/inspector@{INSPECTOR_VERSION}"],
        capture_output=True, text=True, timeout=600,
    )
    if done.returncode != 0 or not launcher.exists():
        return None, f"npm install of the inspector failed: {done.stderr[-500:]}"
    return launcher, ""


if __name__ == "__main__":  # `.ci/run`: python -m tests.orchestrator.mcp.inspector
    found, why = installed_bin()
    print(found or why)
    raise SystemExit(0 if found else 1)
