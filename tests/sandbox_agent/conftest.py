from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentUnavailable
from sandbox_agent.path_sandbox import PathSandbox, Root
from sandbox_agent.wire import AgentConfig, RootConfig
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


@dataclass
class LiveAgent:
    tree: Tree
    proc: subprocess.Popen[bytes]
    client: AgentClient
    token: str
    config: AgentConfig


def write_agent_config(
    tree: Tree, *, resolver: str = "auto", listen_port: int | None = None, **limits: object
) -> tuple[AgentConfig, Path]:
    """An agent's token file and config for user 17 of `tree`: the config and its file."""
    sockets = tree.p("sockets/17")
    sockets.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    token_file = sockets / "token"
    token_file.write_text(token)
    os.chmod(token_file, 0o600)
    config = AgentConfig(
        socket_path=str(sockets / "agent.sock"),
        token_file=str(token_file),
        listen_port=listen_port,
        user_id=17,
        data_root=str(tree.data),
        home=str(tree.p("users/17")),
        tmp_dir=str(tree.p("users/17")),
        roots=[RootConfig(path=r.path, access="rw" if r.writable else "ro", purpose=r.purpose) for r in tree.roots()],
        resolver=resolver,  # type: ignore[arg-type]
        instance_id=secrets.token_hex(4),
        parent_pid=os.getpid(),
        limits={"output_cap_bytes": 4096, **limits},  # type: ignore[arg-type]
    )
    config_file = sockets / "agent.json"
    config_file.write_text(config.model_dump_json())
    return config, config_file


def start_agent(tree: Tree, *, resolver: str = "auto", listen_port: int | None = None, **limits: object) -> LiveAgent:
    config, config_file = write_agent_config(tree, resolver=resolver, listen_port=listen_port, **limits)
    token = Path(config.token_file).read_text()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox_agent", "--config", str(config_file)],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    client = AgentClient(config.socket_path, token)
    deadline = time.monotonic() + 30
    while True:
        try:
            if client.health(timeout_s=1).instance_id == config.instance_id:
                break
        except AgentUnavailable:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"agent did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.02)
    return LiveAgent(tree, proc, client, token, config)


def stop_agent(agent: LiveAgent) -> None:
    agent.client.close()
    if agent.proc.poll() is None:
        agent.proc.terminate()
        try:
            agent.proc.wait(10)
        except subprocess.TimeoutExpired:
            agent.proc.kill()
            agent.proc.wait()
    if agent.proc.stderr:
        agent.proc.stderr.close()


@pytest.fixture
def live_agent(tmp_path: Path) -> Iterator[LiveAgent]:
    agent = start_agent(build_tree(tmp_path))
    yield agent
    stop_agent(agent)


def tool_context(tree: Tree, sandbox: PathSandbox, **limits: object):  # type: ignore[no-untyped-def]
    """An in-process ToolContext over `sandbox`, cwd = the tree's workdir."""
    from sandbox_agent.tools.context import ToolContext

    config = AgentConfig(
        socket_path="/nonexistent/agent.sock",
        token_file="/nonexistent/token",
        user_id=USER,
        data_root=str(tree.data),
        home=str(tree.p("users/17")),
        tmp_dir=str(tree.p("users/17")),
        roots=[],
        limits=limits,  # type: ignore[arg-type]
    )
    return ToolContext(sandbox, config, str(tree.workdir))
