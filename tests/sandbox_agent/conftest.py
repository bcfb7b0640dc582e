from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_agent.path_sandbox import PathSandbox, Root
from tests.agent_env import traversable_tmp  # noqa: F401 - a fixture

USER = 17


@dataclass
class Tree:
    """A small data layout for user 17: own runtime/uploads (rw), a skill view (ro), share,
    another user's runtime and uploads, and a directory outside every root."""

    data: Path
    workdir: Path

    def p(self, rel: str) -> Path:
        return self.data / rel

    def roots(self) -> list[Root]:
        return [
            Root(str(self.p("runtime/17")), True, "runtime"),
            Root(str(self.p("uploads/17")), True, "uploads"),
            Root(str(self.p("users/17")), True, "home"),
            Root(str(self.p("skill-views/17")), False, "skill_views"),
            Root(str(self.p("share")), True, "share"),
        ]


def build_tree(base: Path) -> Tree:
    data = base / "data"
    for rel in [
        "runtime/17/s1/skills", "uploads/17", "users/17", "skill-views/17/foo", "share",
        "runtime/18/s9", "uploads/18", "uploads/1", "uploads/10", "outside",
    ]:
        (data / rel).mkdir(parents=True)
    (data / "skill-views/17/foo/SKILL.md").write_text("# foo skill\n")
    (data / "runtime/18/s9/secret.txt").write_text("18's secret\n")
    (data / "uploads/18/x.png").write_bytes(b"\x89PNG 18")
    (data / "outside/secret.txt").write_text("outside secret\n")
    (data / "runtime/17/s1/hello.txt").write_text("hello\nworld\n")
    os.symlink(data / "skill-views/17/foo", data / "runtime/17/s1/skills/foo")
    return Tree(data, data / "runtime/17/s1")


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return build_tree(tmp_path)


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def sandbox(tree: Tree, resolver: str) -> Iterator[PathSandbox]:
    sb = PathSandbox(tree.roots(), data_root=str(tree.data), user_id=USER, resolver=resolver)  # type: ignore[arg-type]
    yield sb
    sb.close()
