"""The default image is a workbench: in a real docker sandbox, git commits (as the user's display
name) and clones a local bare repository, `make` builds and runs a C program, curl reaches an
allowed loopback upstream through the egress proxy and is refused a disallowed one, pandas and
matplotlib import and write a PNG, and `ps` sees only the sandbox's own processes. Only
127.0.0.1 is contacted."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from tests.api_calls import tool
from tests.conftest import API_TOKEN, admin_headers
from tests.orchestrator.egress.upstream import HELLO, loopback_upstream
from tests.orchestrator.sandboxes.docker.conftest import TEST_BASE, docker_settings, remove_containers
from tests.orchestrator.sandboxes.test_process_network import web_run
from orchestrator.service import OrchestratorService

pytestmark = pytest.mark.docker

USER = 67


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    with loopback_upstream() as port:
        yield port


@pytest.fixture(scope="module")
def git_upstream() -> Iterator[int]:
    """A bare repository served over git's dumb HTTP protocol on 127.0.0.1 (static files)."""
    root = Path(tempfile.mkdtemp(prefix="git-upstream-", dir=TEST_BASE.parent))
    work = root / "work"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid"}  # fmt: skip
    for command in (["git", "init", "-q", "-b", "main", str(work)], ["git", "-C", str(work), "commit", "-q", "--allow-empty", "-m", "upstream"],
                    ["git", "clone", "-q", "--bare", str(work), str(root / "repo.git")],
                    ["git", "-C", str(root / "repo.git"), "update-server-info"]):  # fmt: skip
        subprocess.run(command, check=True, env=env, capture_output=True)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *_args: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def bench(sandbox_image: str) -> Iterator[tuple[TestClient, str]]:
    """One server and one run of user 67 for the whole module (one container)."""
    TEST_BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="t-", dir=TEST_BASE))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    service = OrchestratorService(docker_settings(data, sandbox_image, egress_allow_loopback=True))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            assert client.put(f"/v1/users/{USER}", json={"display_name": "Ada Lovelace"}).status_code == 200
            yield client, web_run(client, USER)
    finally:
        service.close()
        remove_containers(data)
        shutil.rmtree(base, ignore_errors=True)


def sh(bench: tuple[TestClient, str], command: str) -> dict:
    client, run_id = bench
    answer = tool(client, run_id, "shell", command=command, timeout_s=120)
    assert answer["ok"], answer
    return answer["result"]


def test_git_commits_as_the_user_and_clones_a_local_bare_repository(bench: tuple[TestClient, str]) -> None:
    done = sh(bench, (
        "set -e; mkdir -p w && cd w && git init -q proj && cd proj && echo hi > README && git add README "
        "&& git commit -q -m first && git log -1 --format='%an <%ae>' && cd .. "
        "&& git clone -q --bare proj proj.git && git clone -q proj.git copy && cat copy/README"
    ))  # fmt: skip
    assert done["exit_code"] == 0, done
    assert done["stdout"].splitlines() == [f"Ada Lovelace <user-{USER}@users.noreply.invalid>", "hi"], done


def test_make_builds_and_runs_a_c_program(bench: tuple[TestClient, str]) -> None:
    program = '#include <stdio.h>\nint main(void) { printf("%d\\n", 6 * 7); return 0; }\n'
    makefile = "m: m.c\n\tgcc -O2 -o m m.c\n"
    done = sh(bench, f"set -e; mkdir -p c && cd c && cat > m.c <<'EOF'\n{program}EOF\ncat > Makefile <<'EOF'\n{makefile}EOF\nmake -s && ./m")
    assert done["exit_code"] == 0 and done["stdout"].strip() == "42", done


def test_curl_reaches_an_allowed_loopback_upstream_through_the_proxy_only(
    bench: tuple[TestClient, str], upstream: int
) -> None:
    client, _ = bench
    target = f"127.0.0.1:{upstream}"
    curl = f"curl -sS --noproxy '' -x \"$HTTP_PROXY\" -o /dev/null -w '%{{http_code}}' http://{target}/hello"
    refused = sh(bench, curl)
    assert refused["stdout"] == "403", refused
    rules = client.put(f"/v1/admin/users/{USER}/egress", json={"allow": [target]}, headers=admin_headers())
    assert rules.status_code == 200, rules.text
    got = sh(bench, f"curl -sS --noproxy '' -x \"$HTTP_PROXY\" http://{target}/hello")
    assert got["exit_code"] == 0 and got["stdout"] == HELLO.decode(), got
    direct = sh(bench, f"curl -sS --max-time 5 --noproxy '*' http://{target}/hello")  # no way around the proxy
    assert direct["exit_code"] != 0, direct


def test_git_clones_over_http_through_the_egress_proxy_when_the_host_is_allowed(
    bench: tuple[TestClient, str], git_upstream: int
) -> None:
    client, _ = bench
    target = f"127.0.0.1:{git_upstream}"
    # The proxy variables name loopback in NO_PROXY (the sandbox's own ports): emptied here, so
    # git's request to this loopback upstream goes through the proxy as any other host's would.
    clone = f"NO_PROXY= no_proxy= git clone -q http://{target}/repo.git viahttp-{{n}} 2>&1; git -C viahttp-{{n}} log -1 --format=%s"
    refused = sh(bench, clone.format(n=1))
    assert "403" in refused["stdout"], refused
    rules = client.put(f"/v1/admin/users/{USER}/egress", json={"allow": [target]}, headers=admin_headers())
    assert rules.status_code == 200, rules.text
    cloned = sh(bench, clone.format(n=2))
    assert cloned["stdout"].strip().splitlines()[-1] == "upstream", cloned


def test_pandas_and_matplotlib_write_a_png(bench: tuple[TestClient, str]) -> None:
    script = (
        "import pandas as pd, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
        "ax = pd.DataFrame({'x': [1, 2, 3], 'y': [2, 4, 8]}).plot(x='x', y='y'); ax.figure.savefig('chart.png')\n"
    )
    done = sh(bench, f"python3 -c \"{script}\" && head -c 8 chart.png | od -An -c | tr -s ' '")
    assert done["exit_code"] == 0, done
    assert done["stdout"].split()[:4] == ["211", "P", "N", "G"], done


def test_ps_lists_only_the_sandbox_s_own_processes(bench: tuple[TestClient, str]) -> None:
    done = sh(bench, "ps -e -o pid=,comm=")
    assert done["exit_code"] == 0, done
    names = [line.split(None, 1)[1] for line in done["stdout"].splitlines()]
    assert "ps" in names and len(names) < 20, names
    assert not {"dockerd", "containerd", "pytest", "systemd", "kubelet"} & set(names), names
