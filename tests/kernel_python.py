"""A python with ipykernel, matplotlib and pandas for the code-kernel tests (docs/interpreter.md):
the sandbox's user python on the process backend (ORCH_KERNEL_PYTHON). Built once per
checkout into `.cache/kernel-venv` (from the system's /usr/bin/python3, which sandbox uids may
execute, unlike a python under /root), under a lock so parallel test processes build it once."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".cache" / "kernel-venv"
PACKAGES = ("ipykernel", "matplotlib", "pandas")
BASE_PYTHON = "/usr/bin/python3"


def kernel_python() -> str:
    """The venv's python (built when missing); the test is skipped when it cannot be built."""
    python = VENV / "bin" / "python"
    VENV.parent.mkdir(mode=0o755, exist_ok=True)
    with open(VENV.parent / "kernel-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = VENV / ".ready"
        if not ready.exists():
            if not os.access(BASE_PYTHON, os.X_OK):
                pytest.skip(f"no {BASE_PYTHON} to build the kernel venv with")
            try:
                subprocess.run([BASE_PYTHON, "-m", "venv", "--clear", str(VENV)], check=True, capture_output=True, timeout=300)
                subprocess.run(
                    [str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True, capture_output=True, timeout=900
                )
            except (subprocess.SubprocessError, OSError) as exc:
                pytest.skip(f"could not build the kernel venv: {exc}")
            ready.touch()
    for part in (REPO, REPO / ".cache"):  # sandbox uids walk to it
        os.chmod(part, os.stat(part).st_mode | 0o011)
    return str(python)
