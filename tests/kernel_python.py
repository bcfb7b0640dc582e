"""A python with ipykernel, matplotlib and pandas for the code-kernel tests (docs/interpreter.md):
the sandbox's user python on the process backend (ORCH_KERNEL_PYTHON). Built once per machine
into the suite's build cache (tests/build_cache.py), keyed by the packages and the base python
(the system's /usr/bin/python3, which sandbox uids may execute, unlike a python under /root),
under a lock so parallel test processes and checkouts build it once."""

from __future__ import annotations

import fcntl
import os
import subprocess

import pytest

from tests.build_cache import cache_key, cache_root

PACKAGES = ("ipykernel", "matplotlib", "pandas")
BASE_PYTHON = "/usr/bin/python3"


def kernel_python() -> str:
    """The venv's python (built when missing); the test is skipped when it cannot be built."""
    base = os.stat(BASE_PYTHON) if os.access(BASE_PYTHON, os.X_OK) else None
    key = cache_key(PACKAGES, os.path.realpath(BASE_PYTHON), base and (base.st_size, base.st_mtime_ns))
    venv = cache_root() / f"kernel-venv-{key}"
    python = venv / "bin" / "python"
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = venv / ".ready"
        if not ready.exists():
            if base is None:
                pytest.skip(f"no {BASE_PYTHON} to build the kernel venv with")
            try:
                subprocess.run([BASE_PYTHON, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True, timeout=300)
                subprocess.run(
                    [str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True, capture_output=True, timeout=900
                )
            except (subprocess.SubprocessError, OSError) as exc:
                pytest.skip(f"could not build the kernel venv: {exc}")
            ready.touch()
    return str(python)
