"""The Makefile's install step runs again exactly when it must: when `pyproject.toml` changed
or the set of top-level packages did (the editable install's finder maps those at install time,
so a package added by a pull is invisible to `.venv/bin/orchestrator` until a reinstall).

Real `make` on a copy of the real Makefile; the venv's python is a stand-in that records what
it was asked to do, so no network and no real install is needed."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../calls.log"
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy(REPO / "Makefile", root / "Makefile")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for package in ("orchestrator", "mounts"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return root


def install(root: Path) -> list[str]:
    """Run `make install`; the stand-in python's calls, or [] when make had nothing to do."""
    log = root / ".venv" / "calls.log"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    result = subprocess.run(["make", "-C", str(root), "install"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    time.sleep(0.01)  # make compares mtimes: let the next change be strictly newer
    return log.read_text().splitlines() if log.exists() else []


def test_install_runs_on_a_fresh_checkout_and_then_only_when_needed(checkout: Path) -> None:
    calls = install(checkout)
    assert any("pip install" in c and "-e .[test]" in c for c in calls), calls
    assert any("import orchestrator.cli" in c for c in calls)  # checked from outside the checkout
    assert install(checkout) == []

    (checkout / "sandbox_agent").mkdir()  # a pull brings a new top-level package
    (checkout / "sandbox_agent" / "__init__.py").write_text("")
    assert any("-e .[test]" in c for c in install(checkout))
    assert install(checkout) == []

    (checkout / "mounts" / "layout.py").write_text("# a new module in a known package needs nothing\n")
    (checkout / "mounts" / "__init__.py").write_text("# nor an edit of a package's __init__\n")
    assert install(checkout) == []

    (checkout / "docs").mkdir()  # a directory that is not a package needs nothing either
    assert install(checkout) == []

    shutil.rmtree(checkout / "sandbox_agent")
    assert any("-e .[test]" in c for c in install(checkout))

    with open(checkout / "pyproject.toml", "a") as f:
        f.write("\n# a new dependency, say\n")
    assert any("-e .[test]" in c for c in install(checkout))
    assert install(checkout) == []


def test_a_venv_made_by_the_old_makefile_is_refreshed_once(checkout: Path) -> None:
    # The old Makefile left only the stamp, no package list: the next install refreshes it.
    (checkout / ".venv" / ".installed-stamp").touch()
    assert any("-e .[test]" in c for c in install(checkout))
    assert install(checkout) == []


def test_make_run_refuses_a_data_dir_under_tmp_before_installing(checkout: Path) -> None:
    for module in ("orchestrator/preflight.py", "orchestrator/startup_checks.py", "mounts/layout.py", "mounts/ids.py"):
        shutil.copy(REPO / module, checkout / module)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    env["ORCH_DATA_DIR"] = "/tmp/sandbox-orchestrator-preflight-test/data"  # never created
    started = time.monotonic()
    result = subprocess.run(["make", "-C", str(checkout), "run"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode != 0
    assert time.monotonic() - started < 10
    assert "ORCH_DATA_DIR=/var/lib/sandbox-orchestrator make run" in result.stderr, result.stderr
    assert "/tmp is writable by every user" in result.stderr
    assert not (checkout / ".venv" / "calls.log").exists()  # nothing was installed
