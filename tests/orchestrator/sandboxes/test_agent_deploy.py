"""Deploying the agent runtime into {data}/agent/ and running it as a sandbox uid."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mounts.layout import DataLayout
from orchestrator.sandboxes.agent_deploy import KEEP_RELEASES, PYTHON_TAG, AgentDeployment, distribution_closure
from sandbox_agent.build import compute_build_id, own_build_id
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures

AS_ROOT = os.geteuid() == 0


def test_the_closure_has_what_the_agent_imports_and_nothing_for_tests() -> None:
    names = {d.metadata["Name"].lower().replace("_", "-") for d in distribution_closure()}
    assert {"starlette", "uvicorn", "httptools", "h11", "click", "pydantic", "pydantic-core", "anyio", "psutil", "regex"} <= names
    assert not names & {"pytest", "httpx", "docker", "hypothesis", "fastapi"}


def test_the_process_deployment_and_the_image_install_the_same_distributions() -> None:
    # The process backend deploys AGENT_DISTRIBUTIONS from this environment; the docker image
    # installs images/sandbox-requirements.in from the wheelhouse. One list must not drift.
    from orchestrator.sandboxes.agent_deploy import AGENT_DISTRIBUTIONS
    from orchestrator.sandboxes.image.recipe import top_level_requirements

    image_list = Path(__file__).resolve().parents[3] / "images" / "sandbox-requirements.in"
    assert sorted(top_level_requirements(image_list.read_text())) == sorted(AGENT_DISTRIBUTIONS)


def test_a_release_is_content_addressed_complete_and_idempotent(agent_data_dir: Path) -> None:
    layout = DataLayout(agent_data_dir)
    deployment = AgentDeployment(layout)
    release = deployment.ensure()
    assert release.build == own_build_id() == deployment.build
    assert release.path == layout.agent_release_dir(release.release_id)
    assert os.readlink(layout.agent_current) == f"releases/{release.release_id}"
    assert layout.agent_build_file.read_text().strip() == release.build
    manifest = json.loads((release.path / "manifest.json").read_text())
    assert manifest["python"] == PYTHON_TAG and manifest["build"] == release.build
    assert "pydantic-core" in manifest["distributions"]
    assert compute_build_id(release.path / "sandbox_agent") == release.build
    assert (release.path / "site-packages" / "starlette" / "__init__.py").is_file()
    # Bytecode for this interpreter beside every agent source (a sandbox cannot write it at its
    # start), and no other .pyc: each one is of a source of the release.
    agent_sources = list((release.path / "sandbox_agent").rglob("*.py"))
    assert all(Path(importlib.util.cache_from_source(str(p))).is_file() for p in agent_sources)
    for cached in release.path.rglob("*.pyc"):
        stem, tag, _ = cached.name.rsplit(".", 2)
        assert cached.parent.name == "__pycache__" and tag == sys.implementation.cache_tag, cached
        assert (cached.parent.parent / f"{stem}.py").is_file(), cached
    assert AgentDeployment(layout).ensure() == release  # a second orchestrator reuses it
    assert [p.name for p in layout.agent_releases_dir.iterdir()] == [release.release_id]


def test_old_releases_are_pruned_but_recent_ones_kept(agent_data_dir: Path) -> None:
    layout = DataLayout(agent_data_dir)
    release = AgentDeployment(layout).ensure()
    for i in range(5):
        fake = layout.agent_releases_dir / (f"{i}" * 64)
        fake.mkdir()
        os.utime(fake, (1000 + i, 1000 + i))
    AgentDeployment(layout)._prune(keep=release.release_id)
    kept = sorted(p.name for p in layout.agent_releases_dir.iterdir())
    assert len(kept) == KEEP_RELEASES and release.release_id in kept and "4" * 64 in kept


def test_the_deployed_agent_runs_isolated_and_reports_the_host_build(agent_data_dir: Path) -> None:
    layout = DataLayout(agent_data_dir)
    deployment = AgentDeployment(layout)
    release = deployment.ensure()
    uid = 100017 if AS_ROOT else None
    python = deployment.interpreter_for(uid)
    identity = {"user": uid, "group": uid} if uid is not None else {}
    out = subprocess.run(
        [python, "-I", "-S", str(release.launcher), "--print-build"],
        capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"}, timeout=60, **identity,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == deployment.build


def test_the_agent_started_as_a_sandbox_uid_compiles_nothing(agent_data_dir: Path) -> None:
    """Its imports load the release's bytecode: the sandbox uid cannot write the release, and a
    module compiled from source at every start cost about a second of each sandbox start."""
    deployment = AgentDeployment(DataLayout(agent_data_dir))
    release = deployment.ensure()
    uid = 100017 if AS_ROOT else None
    identity = {"user": uid, "group": uid} if uid is not None else {}
    paths = [str(release.path), str(release.path / "site-packages")]
    out = subprocess.run(
        [deployment.interpreter_for(uid), "-I", "-S", "-v", "-c", f"import sys; sys.path[:0] = {paths!r}; import sandbox_agent.app"],
        capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"}, timeout=60, **identity,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    loaded = [line for line in out.stderr.splitlines() if line.startswith("# code object from") and str(release.path) in line]
    assert len(loaded) > 100, loaded  # starlette, pydantic, the agent...
    compiled = [line for line in loaded if not line.endswith(".pyc'")]
    assert compiled == [], compiled


@pytest.mark.skipif(not AS_ROOT, reason="the interpreter probe matters only for other uids")
def test_the_interpreter_for_sandbox_uids_is_one_they_can_execute(agent_data_dir: Path) -> None:
    deployment = AgentDeployment(DataLayout(agent_data_dir))
    deployment.ensure()
    python = deployment.interpreter_for(100042)
    check = subprocess.run([python, "-c", "print(1)"], user=100042, group=100042, capture_output=True, text=True)
    assert check.stdout.strip() == "1"


@pytest.mark.skipif(not AS_ROOT, reason="needs root to act as a sandbox uid")
def test_a_data_dir_the_uid_cannot_reach_is_a_clear_error(tmp_path: Path) -> None:
    hidden = tmp_path / "data"  # under pytest's 0700 tmp dir
    deployment = AgentDeployment(DataLayout(hidden))
    deployment.ensure()
    with pytest.raises(RuntimeError, match="traversable"):
        deployment.interpreter_for(100042)
