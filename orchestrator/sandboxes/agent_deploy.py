"""Deploying the sandbox agent into `{data}/agent/`.

A release is the agent's code plus the files of every distribution it imports, taken from
the orchestrator's own environment with `importlib.metadata` (same versions, no network),
and a small launcher. Releases are content-addressed (`releases/{hash}/`), built in a
staging dir and renamed into place, never modified; `current` points at the newest and
`BUILD` holds its agent BUILD id. Files are hard-linked from the environment when it is on
the same file system, copied otherwise.

Sandbox uids cannot run the orchestrator's interpreter when it lives under /root (0700), so
the interpreter for them is chosen by actually running candidates as such a uid.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.metadata as metadata
import importlib.util
import json
import logging
import os
import py_compile
import re
import secrets
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from mounts.fs.atomic_write import replace_file_at, replace_symlink_at
from mounts.fs.nofollow import closing_fd, open_root
from mounts.fs.tree_removal import remove_tree
from mounts.layout import DataLayout
from orchestrator.log import kv
from sandbox_agent.build import PACKAGE_DIR, compute_build_id, source_files

log = logging.getLogger(__name__)

# What the agent imports at run time; their requirements are followed from the metadata.
# Keep in step with images/sandbox-requirements.in (the docker image's copy; a test checks).
AGENT_DISTRIBUTIONS = ("starlette", "uvicorn", "httptools", "pydantic", "psutil", "regex")
KEEP_RELEASES = 3
PYTHON_TAG = f"{sys.version_info.major}.{sys.version_info.minor}"

LAUNCHER = '''"""Start the sandbox agent from this release, isolated from any other site-packages
(run with `python -I -S launch.py --config FILE`)."""
import os
import runpy
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "site-packages")]
runpy.run_module("sandbox_agent", run_name="__main__", alter_sys=True)
'''


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_closure(names: tuple[str, ...] = AGENT_DISTRIBUTIONS) -> list[metadata.Distribution]:
    """The installed distributions `names` need, following requirements that apply to every
    install (no `extra ==` marker). One whose marker excludes this Python is not installed
    here, so "installed" is the test for the others."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = _canonical(name)
        if key in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name in names:
                raise RuntimeError(f"the agent needs {name}, which is not installed") from None
            continue
        found[key] = dist
        for requirement in dist.requires or []:
            _, _, marker = requirement.partition(";")
            if "extra" in marker:
                continue
            match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
            if match:
                todo.append(match.group(0))
    return sorted(found.values(), key=lambda d: _canonical(d.metadata["Name"]))


def _dist_files(dist: metadata.Distribution) -> list[tuple[str, Path]]:
    """(path relative to site-packages, source) of the files a distribution installed there;
    scripts outside site-packages and bytecode caches are left out."""
    files = []
    for entry in dist.files or []:
        rel = entry.as_posix()
        if rel.startswith("../") or rel.startswith("/") or "__pycache__" in rel or rel.endswith(".pyc"):
            continue
        source = Path(dist.locate_file(entry))
        if source.is_file():
            files.append((rel, source))
    return files


# Bytecode in the release: a sandbox cannot write the release, so without it every agent start
# compiled its imports from source (about a second of each start on two cores). Python checks
# each .pyc against its source's mtime and size and ignores one that does not match, or is
# another version's (the file name carries the interpreter's tag).
def _compile(source: Path) -> None:
    """The .pyc of a copied source, for this interpreter."""
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)), doraise=True)
    os.chmod(importlib.util.cache_from_source(str(source)), 0o644)


def _place_bytecode(source: Path, dest: Path) -> None:
    """The installed .pyc of a linked source (same inode, so the same mtime), when it has one."""
    if dest.suffix != ".py":
        return
    cached = Path(importlib.util.cache_from_source(str(source)))
    if cached.is_file():
        _place(cached, Path(importlib.util.cache_from_source(str(dest))))


@dataclass(frozen=True)
class AgentRelease:
    release_id: str
    path: Path
    build: str

    @property
    def launcher(self) -> Path:
        return self.path / "launch.py"

    def command(self, python: str, config_path: Path) -> list[str]:
        # -I: ignore PYTHON* variables and the user site; -S: no system site-packages either.
        return [python, "-I", "-S", str(self.launcher), "--config", str(config_path)]


def _place(source: Path, dest: Path) -> bool:
    """Hard-link `source` to `dest` (copy across file systems); True when linked."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
            raise
    shutil.copy2(source, dest)
    os.chmod(dest, 0o755 if os.access(source, os.X_OK) else 0o644)
    return False


class AgentDeployment:
    def __init__(self, layout: DataLayout, *, package_dir: Path = PACKAGE_DIR) -> None:
        self.layout = layout
        self.package_dir = package_dir
        self._lock = threading.Lock()
        self._release: AgentRelease | None = None
        self._interpreters: dict[int | None, str] = {}
        self._build: str | None = None

    @property
    def build(self) -> str:
        """The host's agent BUILD id (what a freshly started agent reports). Computed once:
        the code this orchestrator ships changes with an upgrade, i.e. a restart."""
        if self._build is None:
            self._build = compute_build_id(self.package_dir)
        return self._build

    def refresh(self) -> str:
        """Recompute the BUILD id (after the package on disk changed) and return it."""
        with self._lock:
            self._build = None
            self._release = None
        return self.build

    def release_id(self, build: str, dists: list[metadata.Distribution]) -> str:
        digest = hashlib.sha256()
        digest.update(f"build={build}\npython={PYTHON_TAG}\nlauncher={LAUNCHER}\n".encode())
        for dist in dists:
            digest.update(f"{_canonical(dist.metadata['Name'])}=={dist.version}\n".encode())
        return digest.hexdigest()

    def ensure(self) -> AgentRelease:
        """The current release, deployed if needed (idempotent, safe across processes)."""
        with self._lock:
            build = self.build
            if self._release is not None and self._release.build == build and self._release.path.is_dir():
                return self._release
            dists = distribution_closure()
            release_id = self.release_id(build, dists)
            target = self.layout.agent_release_dir(release_id)
            if not (target / "manifest.json").is_file():
                self._build_release(target, release_id, build, dists)
            self._point_current(release_id, build)
            self._prune(keep=release_id)
            self._release = AgentRelease(release_id, target, build)
            return self._release

    def _build_release(
        self, target: Path, release_id: str, build: str, dists: list[metadata.Distribution]
    ) -> None:
        agent_dir = self.layout.agent_dir
        releases = self.layout.agent_releases_dir
        for directory in (agent_dir, releases):
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, 0o755)  # read-only for sandboxes, readable by every sandbox uid
        staging = releases / f".staging-{secrets.token_hex(6)}"
        staging.mkdir(mode=0o755)
        linked = copied = 0
        try:
            for source in source_files(self.package_dir):
                dest = staging / "sandbox_agent" / source.relative_to(self.package_dir)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, dest)  # a copy: the BUILD id must describe exactly these bytes
                os.chmod(dest, 0o644)
                _compile(dest)
            site = staging / "site-packages"
            for dist in dists:
                for rel, source in _dist_files(dist):
                    if _place(source, site / rel):
                        linked += 1
                    else:
                        copied += 1
                    _place_bytecode(source, site / rel)
            (staging / "launch.py").write_text(LAUNCHER)
            manifest = {
                "release": release_id,
                "build": build,
                "python": PYTHON_TAG,
                "distributions": {_canonical(d.metadata["Name"]): d.version for d in dists},
            }
            (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
            for root, dirs, files in os.walk(staging):
                os.chmod(root, 0o755)
                for name in ("launch.py", "manifest.json"):
                    if name in files:
                        os.chmod(os.path.join(root, name), 0o644)
            try:
                os.rename(staging, target)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                remove_tree(staging)  # another orchestrator deployed the same release first
        except BaseException:
            with contextlib.suppress(OSError):  # the original error is the one to report
                remove_tree(staging)
            raise
        log.info("deployed the sandbox agent %s", kv(release=release_id[:16], build=build, linked=linked, copied=copied))

    def _point_current(self, release_id: str, build: str) -> None:
        current = self.layout.agent_current
        relative = f"releases/{release_id}"  # relative: valid at the same path inside containers
        try:
            if os.readlink(current) == relative:
                return
        except OSError:
            pass
        with closing_fd(open_root(self.layout.agent_dir)) as dir_fd:
            replace_symlink_at(dir_fd, current.name, relative, temp=f".current-{secrets.token_hex(6)}")
            replace_file_at(dir_fd, self.layout.agent_build_file.name, f"{build}\n".encode(), mode=0o644)

    def _prune(self, *, keep: str) -> None:
        """Keep the current release and the newest few: agents started from an older one may
        still be running and import modules lazily."""
        releases = self.layout.agent_releases_dir
        entries = sorted(
            (p for p in releases.iterdir() if not p.name.startswith(".") and p.name != keep),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for old in entries[KEEP_RELEASES - 1 :]:
            try:
                remove_tree(old)
            except OSError as exc:  # a release we cannot remove now is tried again next deploy
                log.warning("old agent release not removed %s", kv(release=old.name, error=exc))

    # --- the interpreter --------------------------------------------------------------

    def interpreter_for(self, uid: int | None) -> str:
        """A Python of this major.minor that `uid` can execute (None: the current user),
        verified by running it as that uid and reading the data root."""
        key = None if uid is None else -1  # sandbox uids differ only in number: one check serves all
        with self._lock:
            cached = self._interpreters.get(key)
        if cached is not None:
            return cached
        if uid is None:
            chosen = sys.executable
        else:
            chosen = self._probe(uid)
        with self._lock:
            self._interpreters[key] = chosen
        return chosen

    def _probe(self, uid: int) -> str:
        candidates = [sys.executable, os.path.realpath(sys.executable), f"/usr/bin/python{PYTHON_TAG}"]
        which = shutil.which(f"python{PYTHON_TAG}", path="/usr/local/bin:/usr/bin:/bin")
        if which:
            candidates.append(which)
        check = (
            "import os, sys; os.listdir(sys.argv[2]);"
            "print('%d.%d' % sys.version_info[:2])"
        )
        problems = []
        for python in dict.fromkeys(candidates):
            try:
                out = subprocess.run(
                    [python, "-I", "-S", "-c", check, "probe", str(self.layout.agent_dir)],
                    user=uid,
                    group=uid,
                    capture_output=True,
                    text=True,
                    timeout=20,
                    cwd="/",
                    env={"PATH": "/usr/bin:/bin"},
                )
            except (OSError, subprocess.SubprocessError) as exc:
                problems.append(f"{python}: {exc}")
                continue
            if out.returncode == 0 and out.stdout.strip() == PYTHON_TAG:
                log.info("sandbox agents run with %s", kv(python=python, checked_as_uid=uid))
                return python
            problems.append(f"{python}: exit {out.returncode} {out.stdout.strip()} {out.stderr.strip()[-200:]}")
        raise RuntimeError(
            f"no Python {PYTHON_TAG} that uid {uid} can run and that can read {self.layout.agent_dir} "
            f"(are the data dir's parents traversable?): " + "; ".join(problems)
        )
