"""The client as its own distribution (deploy/client/): it imports nothing of the server, its wheel
ships orchestrator/client/ and depends on httpx and pydantic only, and the README's bot example
runs from a fresh venv holding nothing but that wheel against a live server."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.conftest import API_TOKEN, make_settings
from tests.live_server import free_port, live_server
from tests.orchestrator.test_readme_bot import readme_bot

REPO = Path(__file__).resolve().parents[2]
SERVER_ONLY = ["fastapi", "uvicorn", "mcp", "docker", "kubernetes", "pycares", "psutil", "watchfiles"]

# Imports `orchestrator.client` with every other module of the repository made unimportable.
BLOCKED_IMPORT = """
import importlib.abc, sys
class ServerBlocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mounts", "sandbox_agent") or (
            name.startswith("orchestrator.") and not name.startswith("orchestrator.client")
        ):
            raise ImportError(f"the client imported {name}")
        return None
sys.meta_path.insert(0, ServerBlocker())
from orchestrator.client import AsyncOrchestratorClient, IdentityMode, OrchestratorClient, Trigger
print(sorted(n for n in sys.modules if n.split(".")[0] in ("orchestrator", "mounts", "sandbox_agent")))
"""

# The README's bot block run by a script of the venv: a model that asks for the given calls,
# a chat that keeps what is posted, then what the model saw as JSON on stdout.
README_RUNNER = """
import json, os, sys, types
import orchestrator, orchestrator.client
calls = [types.SimpleNamespace(id=c[0], name=c[1], arguments=c[2]) for c in json.loads(os.environ["CALLS"])]
class Model:
    seen = []
    def turn(self, identity_section, catalog):
        yield from calls
    def observe(self, call_id, body):
        self.seen.append([call_id, body])
class Chat:
    posted = []
    def post(self, delivery):
        self.posted.append(delivery.data.decode())
namespace = {"BOT_TOKEN": os.environ["BOT_TOKEN"], "chat_id": "oc_wheel", "speaker": 67, "model": Model(), "chat": Chat()}
exec(compile(open(os.environ["README_BOT"]).read(), "README.md", "exec"), namespace)
namespace["bot"].close()
print(json.dumps({"seen": Model.seen, "posted": Chat.posted, "workdir": namespace["run"].workdir,
                  "client_file": orchestrator.client.__file__, "namespace_package": getattr(orchestrator, "__file__", None) is None}))
"""


def test_the_client_imports_nothing_of_the_server() -> None:
    done = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.replace("'", '"'))
    assert loaded and all(name == "orchestrator" or name.startswith("orchestrator.client") for name in loaded), loaded


def build_wheel(out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(REPO / "deploy" / "client"), "-w", str(out)],
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("sandbox_orchestrator_client-*-py3-none-any.whl")
    return wheel


def test_the_wheel_holds_the_client_and_requires_httpx_and_pydantic_only(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    package = sorted(n for n in names if not n.startswith("sandbox_orchestrator_client-"))
    assert package == sorted(p.relative_to(REPO).as_posix() for p in (REPO / "orchestrator" / "client").glob("*.py"))
    assert "orchestrator/__init__.py" not in names  # a namespace package: nothing of the server's
    meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = zipfile.ZipFile(wheel).read(meta_name).decode()
    assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")] == [
        "Requires-Dist: httpx>=0.27",
        "Requires-Dist: pydantic>=2.6",
    ]
    import orchestrator

    assert f"Version: {orchestrator.__version__}\n" in metadata
    assert build_wheel(tmp_path / "again").read_bytes() == wheel.read_bytes()  # reproducible


@pytest.fixture
def server_url(agent_data_dir) -> Iterator[str]:
    port = free_port()
    service = OrchestratorService(make_settings(agent_data_dir, public_base_url=f"http://127.0.0.1:{port}"))
    try:
        with live_server(create_app(service), port) as base:
            yield base
    finally:
        service.close()


def client_venv(root: Path) -> Path:
    """A fresh venv with the built wheel and what pip brings for it, nothing else; its python."""
    wheel = build_wheel(root / "wheel")
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=600)
    return python


@pytest.mark.slow
def test_the_readme_bot_runs_from_a_venv_with_the_client_wheel_alone(tmp_path: Path, server_url: str) -> None:
    python = client_venv(tmp_path)
    shown = subprocess.run([str(python), "-m", "pip", "show", "sandbox-orchestrator-client"], capture_output=True, text=True, check=True)
    assert "Requires: httpx, pydantic" in shown.stdout, shown.stdout
    installed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True)
    names = {p["name"].lower() for p in json.loads(installed.stdout)}
    assert {"sandbox-orchestrator-client", "httpx", "pydantic"} <= names and not names & set(SERVER_ONLY), names
    server_module = subprocess.run([str(python), "-I", "-c", "import orchestrator.identity"], cwd=tmp_path, capture_output=True, text=True)
    assert "No module named 'orchestrator.identity'" in server_module.stderr

    (tmp_path / "bot.py").write_text(readme_bot())
    retried = ["t-count", "shell", {"command": "echo ran >> retried.txt; echo counted"}]
    calls = [
        ["t-write", "write_file", {"path": "report.txt", "content": "report\n"}],
        retried,
        retried,  # the bot repeats a call it did not see the answer of
        ["t-send", "send_file", {"path_or_url": "report.txt"}],
        ["t-invented", "search_the_web", {"query": "x"}],
    ]
    env = {"ORCH_URL": server_url, "BOT_TOKEN": API_TOKEN, "README_BOT": str(tmp_path / "bot.py"), "CALLS": json.dumps(calls)}
    # -I: no current directory nor PYTHONPATH on sys.path, so only the venv's packages import.
    ran = subprocess.run([str(python), "-I", "-c", README_RUNNER], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["client_file"].startswith(str(tmp_path / "venv")) and out["namespace_package"]
    seen = {}
    for call_id, body in out["seen"]:
        seen.setdefault(call_id, []).append(body)
    first, repeat = seen["t-count"]
    assert first == repeat and first["result"]["stdout"] == "counted\n"
    assert (Path(out["workdir"]) / "retried.txt").read_text() == "ran\n"  # ran once
    assert out["posted"] == ["report\n"]
    assert seen["t-invented"][0]["error"]["code"] == "unknown_tool"
