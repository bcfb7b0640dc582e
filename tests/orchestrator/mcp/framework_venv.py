"""A venv holding one agent framework, pinned, for tests that drive the framework's own MCP client
against our live server from a process of its own: the frameworks pin MCP SDKs the server's venv
cannot hold (langchain-mcp-adapters requires the SDK 1.x, the server the 2.x), and their
dependencies are not the server's to carry. Built once per requirement set and Python, kept in
the suite's build cache (tests/build_cache.py: every checkout on the machine reuses it; pip from
the package index, ~15-25 s each)."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from tests.build_cache import cache_key, cache_root

FRAMEWORKS = {
    "pydantic-ai": ["pydantic-ai-slim[mcp]==2.78.0"],
    "langchain": ["langchain==1.5.2", "langchain-mcp-adapters==0.3.2"],
    "openai-agents": ["openai-agents==0.24.0"],
}
DRIVERS = Path(__file__).resolve().parent / "framework_drivers"


def framework_python(framework: str) -> Path:
    """The python of the framework's venv, built first when the cache has none."""
    requirements = FRAMEWORKS[framework]
    root = cache_root() / "framework-venvs" / f"{framework}-{cache_key(requirements, sys.version)}"
    root.parent.mkdir(exist_ok=True)
    python = root / "bin" / "python"
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once build it once
        if not (root / ".complete").exists():
            shutil.rmtree(root, ignore_errors=True)  # a build that was cut short
            venv.EnvBuilder(with_pip=True).create(root)
            pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *requirements], capture_output=True, text=True, timeout=900)
            assert pip.returncode == 0, pip.stderr[-4000:]
            (root / ".complete").write_text("\n".join(requirements) + "\n")
    return python


def run_driver(framework: str, driver: str, env: dict[str, str], timeout: float = 300) -> list:
    """Run a driver script (framework_drivers/) in the framework's venv; its JSON answer.
    `-I`: neither the checkout nor PYTHONPATH is on its sys.path, only the venv's packages."""
    done = subprocess.run(
        [str(framework_python(framework)), "-I", str(DRIVERS / driver)], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
