"""`orchestrator gc` as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from mounts.layout import DataLayout
from mounts.skillstore.scan import scan_skill
from orchestrator.skills.service import SkillService
from tests.mounts.skillstore.conftest import write_skill


def gc(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_DATA_DIR"] = str(data_dir)
    return subprocess.run([sys.executable, "-m", "orchestrator", "gc", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_gc_command_removes_old_unreferenced_content_and_keeps_the_rest(tmp_path: Path) -> None:
    data = tmp_path / "data"
    skills = SkillService(DataLayout(data))
    write_skill(skills.layout.skill_source("used"), {})
    skills.sync_for_run("default", 5, "s")
    orphan = write_skill(skills.layout.skill_source("orphan"), {"x": "y"})
    fp = scan_skill(orphan).fingerprint
    entry = skills.store.ensure_entry(fp, "orphan", orphan)
    ten_days_ago = time.time() - 10 * 86400
    os.utime(entry, (ten_days_ago, ten_days_ago))
    used_fp = skills.views.current(5, "used")
    assert used_fp
    os.utime(skills.layout.content_entry(used_fp, "used"), (ten_days_ago, ten_days_ago))

    dry = gc(data, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would remove skill=orphan fingerprint={fp}" in dry.stdout and entry.exists()
    kept = gc(data, "--days", "30")
    assert kept.returncode == 0 and "removed=0" in kept.stdout and entry.exists()
    done = gc(data, "--verify")
    assert done.returncode == 0, done.stderr
    assert "removed=1" in done.stdout and "kept_referenced=1" in done.stdout and "corrupt=0" in done.stdout
    assert not entry.exists() and skills.store.has_entry(used_fp, "used")
    assert gc(data, "--days", "-1").returncode == 2
