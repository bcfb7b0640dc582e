"""Code kernels through the real API (issue 28, docs/interpreter.md): real ipykernels and bash
kernels in real sandboxes, one live server per backend for the module. The process backend's
user python is a venv with ipykernel, matplotlib and pandas (tests/kernel_python.py)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from orchestrator.client import AsyncOrchestratorClient, OrchestratorClient, RunCodeResult
from orchestrator.http.app import create_app
from orchestrator.mcp.connect import run_session
from orchestrator.service import OrchestratorService
from tests.api_calls import MEMBER, OWNER
from tests.conftest import API_TOKEN, TEST_ROOT, make_settings
from tests.kernel_python import kernel_python
from tests.live_api import LiveApi as Api
from tests.live_server import live_server

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids need root")

_BASE = int(os.environ.get("ORCH_SANDBOX_UID_BASE") or 1_160_000_000)
UIDS = {"sandbox_uid_base": _BASE, "max_user_id": 20_000}
KERNELS_PER_USER = 3
PAUSE_AFTER_S = 300.0  # only the pause test's own reaper round pauses


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    if request.param == "docker":  # the workbench image's own python3, with ipykernel
        from tests.orchestrator.sandboxes.docker.conftest import TEST_BASE, docker_settings
        from tests.sandbox_image import ensure_sandbox_image, recipe_tag

        image = recipe_tag(ensure_sandbox_image())
        TEST_BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="t-", dir=TEST_BASE))
    else:
        python = kernel_python()
        base = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="orch-kernels-"))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    if request.param == "docker":
        settings = docker_settings(
            data, image, kernels_per_user=KERNELS_PER_USER, pause_after_s=PAUSE_AFTER_S, idle_timeout_s=900, **UIDS
        )
    else:
        settings = make_settings(
            data, kernel_python=python, kernels_per_user=KERNELS_PER_USER, pause_after_s=PAUSE_AFTER_S, idle_timeout_s=900, **UIDS
        )
    service = OrchestratorService(settings)
    try:
        with live_server(create_app(service)) as url:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=180) as http:
                yield Api(url, service, http, request.param, "oc_kernels")
    finally:
        service.close()
        if request.param == "docker":
            from tests.orchestrator.sandboxes.docker.conftest import remove_containers

            remove_containers(data)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _sessions_deleted(api: Api) -> Iterator[None]:
    """Each test's sessions are deleted after it, and their kernels with them (the cap)."""
    yield
    while api.sessions:
        api.http.delete(f"/v1/sessions/{api.sessions.pop()}")


def test_state_survives_between_calls(api: Api) -> None:
    run_id = api.run(api.session())
    first = api.ok(run_id, "run_code", code="x = 41")
    assert first["status"] == "ok" and first["text"] is None and first["kernel"] == {"name": "default", "language": "python"}
    answer = api.ok(run_id, "run_code", code="x + 1")
    assert answer["text"] == "42" and answer["data"] == {"text/plain": "42"}
    assert answer["kernel_restarted"] is False and answer["error"] is None and answer["images"] == []
    # cwd persists, and printing goes to stdout/stderr
    api.ok(run_id, "run_code", code="import os; os.makedirs('sub', exist_ok=True); os.chdir('sub')")
    where = api.ok(run_id, "run_code", code="import sys; print(os.getcwd()); print('warn', file=sys.stderr)")
    assert where["stdout"].strip().endswith("/sub") and where["stderr"] == "warn\n"
    # a later run of the same session reaches the same kernel
    again = api.ok(api.run(api.http.get(f"/v1/runs/{run_id}").json()["session_id"]), "run_code", code="x")
    assert again["text"] == "41"


def test_a_pandas_frame_from_an_upload(api: Api) -> None:
    run_id = api.run(api.session())
    response = api.http.put(f"/v1/runs/{run_id}/files/incoming/numbers.csv", content=b"a,b\n1,2\n3,4\n5,6\n")
    assert response.status_code in (200, 201), response.text
    path = response.json()["path"]
    api.ok(run_id, "run_code", code=f"import pandas as pd\ndf = pd.read_csv({path!r})")
    shape = api.ok(run_id, "run_code", code="df.shape")
    assert shape["text"] == "(3, 2)"
    html = api.ok(run_id, "run_code", code="df")
    assert "<table" in html["data"]["text/html"] and "text/plain" in html["data"]


def test_errors_are_readable(api: Api) -> None:
    run_id = api.run(api.session())
    answer = api.ok(run_id, "run_code", code="def f():\n    return 1 / 0\nf()")
    assert answer["status"] == "error"
    error = answer["error"]
    assert error["ename"] == "ZeroDivisionError" and error["evalue"] == "division by zero"
    assert "\x1b" not in error["traceback"] and "return 1 / 0" in error["traceback"]


def test_a_chart_comes_back_as_a_png_file_ready_to_send(api: Api) -> None:
    run_id = api.run(api.session())
    code = (
        "import matplotlib.pyplot as plt\n"
        "fig = plt.figure(figsize=(4, 3), dpi=100)\n"
        "plt.plot(range(1000), [i * i for i in range(1000)])\n"
        "plt.show()"
    )
    answer = api.ok(run_id, "run_code", code=code)
    assert answer["status"] == "ok", answer
    [image] = answer["images"]
    assert image["mime"] == "image/png" and "/outputs/" in image["path"]
    png = Path(image["path"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) == image["size"]
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (400, 300)
    assert "iVBOR" not in json.dumps(answer)  # never inlined as base64
    sent = api.tool(run_id, "send_image", path_or_url=image["path"])
    assert sent["ok"], sent
    delivery = api.http.get(f"/v1/deliveries/{sent['result']['delivery_id']}")
    assert delivery.status_code == 200, delivery.text


def test_timeout_interrupts_and_the_state_survives(api: Api) -> None:
    run_id = api.run(api.session())
    api.ok(run_id, "run_code", code="x = 7")
    started = time.monotonic()
    answer = api.ok(run_id, "run_code", code="print('before', flush=True)\nwhile True: pass", timeout_s=2)
    took = time.monotonic() - started
    assert answer["status"] == "timeout" and answer["kernel_restarted"] is False, answer
    assert "before" in answer["stdout"] and 1.9 < took < 6, took
    assert api.ok(run_id, "run_code", code="x")["text"] == "7"


def test_a_dead_kernel_is_said_and_the_next_call_works(api: Api) -> None:
    run_id = api.run(api.session())
    api.ok(run_id, "run_code", code="y = 1")
    died = api.ok(run_id, "run_code", code="import os; os._exit(1)")
    assert died["status"] == "kernel_died" and died["kernel_restarted"] is True
    assert "state" in died["note"] and "lost" in died["note"]
    after = api.ok(run_id, "run_code", code="'y' in globals()")
    assert after["status"] == "ok" and after["text"] == "False"


def test_bash_keeps_its_cwd_and_exports(api: Api) -> None:
    run_id = api.run(api.session())
    api.ok(run_id, "run_code", language="bash", code="export A=1; mkdir -p d; cd d")
    answer = api.ok(run_id, "run_code", language="bash", code="echo $A; basename $PWD")
    assert answer["stdout"] == "1\nd\n" and answer["kernel"] == {"name": "default", "language": "bash"}
    failed = api.ok(run_id, "run_code", language="bash", code="false")
    assert failed["status"] == "error" and failed["error"]["ename"] == "ExitStatus"
    # A command past its timeout is interrupted; the shell and its variables stay.
    slow = api.ok(run_id, "run_code", language="bash", code="echo start; sleep 30; echo never", timeout_s=1)
    assert slow["status"] == "timeout" and slow["kernel_restarted"] is False and "never" not in slow["stdout"], slow
    assert api.ok(run_id, "run_code", language="bash", code="echo $A")["stdout"] == "1\n"


def test_kernels_are_per_speaker_listed_and_capped(api: Api) -> None:
    session_id = api.session("oc_two_speakers")
    run_67, run_17 = api.run(session_id, MEMBER), api.run(session_id, OWNER)
    api.ok(run_67, "run_code", code="secret = 'of 67'")
    seen = api.ok(run_17, "run_code", code="'secret' in globals()")
    assert seen["text"] == "False"  # 17's kernel is another process in another sandbox
    names_67 = [(k["name"], k["language"]) for k in api.ok(run_67, "kernel_list")["kernels"]]
    names_17 = [(k["name"], k["language"]) for k in api.ok(run_17, "kernel_list")["kernels"]]
    assert names_67 == [("default", "python")] and names_17 == [("default", "python")]
    listed = api.ok(run_67, "kernel_list")["kernels"][0]
    assert listed["session_id"] == session_id and listed["started_at"] and listed["last_used_at"]
    # The cap counts every kernel of the user's sandbox (other sessions' too).
    for index in range(KERNELS_PER_USER + 1):
        body = api.tool(run_67, "run_code", language="bash", kernel=f"k{index}", code="true")
        if not body["ok"]:
            break
    assert body["ok"] is False and body["error"]["code"] == "too_many_kernels", body
    for index in range(KERNELS_PER_USER):
        api.tool(run_67, "kernel_shutdown", language="bash", kernel=f"k{index}")
    restarted = api.ok(run_67, "kernel_restart")
    assert restarted["restarted"] is True
    assert api.ok(run_67, "run_code", code="'secret' in globals()")["text"] == "False"
    gone = api.tool(run_67, "kernel_shutdown", kernel="nothing-here")
    assert gone["ok"] is False and gone["error"]["code"] == "not_found"


def test_deleting_the_session_kills_its_kernels(api: Api) -> None:
    session_id = api.session("oc_delete_kernels")
    run_id = api.run(session_id)
    code = "import os, subprocess\np = subprocess.Popen(['sleep', '300'])\nprint(os.getpid(), p.pid)"
    pids = api.ok(run_id, "run_code", code=code)["stdout"].split()
    # Checked from inside the sandbox (another session of the same user): pids as it sees them.
    other = api.run(api.session("oc_delete_kernels"))  # the same group: the same plan, no agent restart
    probe = " ".join(f"[ -e /proc/{pid} ] && awk '{{print $3}}' /proc/{pid}/stat;" for pid in pids)
    assert api.ok(other, "shell", command=probe)["stdout"].split() == ["S", "S"]
    response = api.http.delete(f"/v1/sessions/{session_id}")
    assert response.status_code in (200, 204), response.text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [state for state in api.ok(other, "shell", command=probe + " true")["stdout"].split() if state != "Z"]
        if not left:
            break
        time.sleep(0.2)
    assert left == []
    assert api.ok(other, "kernel_list")["kernels"] == []


def test_a_kernel_survives_the_sweep_after_a_shell_call(api: Api) -> None:
    run_id = api.run(api.session())
    api.ok(run_id, "run_code", code="import subprocess; z = 5; p = subprocess.Popen(['sleep', '300'])")
    api.ok(run_id, "shell", command="true")  # the sweep after it spares the kernel and what it started
    assert api.ok(run_id, "run_code", code="z, p.poll()")["text"] == "(5, None)"


def test_streamed_run_code_sends_output_as_it_comes(api: Api) -> None:
    run_id = api.run(api.session())
    events = []
    with api.http.stream(
        "POST",
        f"/v1/runs/{run_id}/tools/run_code",
        json={"arguments": {"code": "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.3)"}},
        headers={"Accept": "text/event-stream"},
    ) as response:
        assert response.status_code == 200
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[6:]), time.monotonic()))
    outputs = [e for e in events if e[0] == "output"]
    assert "".join(e[1]["text"] for e in outputs) == "0\n1\n2\n"
    assert outputs[-1][2] - outputs[0][2] > 0.4  # they came as printed, not at the end
    assert events[-1][0] == "result" and events[-1][1]["result"]["stdout"] == "0\n1\n2\n"



def test_the_client_run_code_is_typed_sync_and_async(api: Api) -> None:
    run_id = api.run(api.session())
    with OrchestratorClient(api.url, token=API_TOKEN) as bot:
        bot.run_code(run_id, "import math\nr = 2")
        result = bot.run_code(run_id, "math.pi * r ** 2")
        assert isinstance(result, RunCodeResult) and result.status == "ok" and result.text.startswith("12.566")
        failed = bot.run_code(run_id, "raise ValueError('no')")
        assert failed.status == "error" and failed.error is not None and failed.error.ename == "ValueError"

    async def scenario() -> RunCodeResult:
        async with AsyncOrchestratorClient(api.url, token=API_TOKEN) as bot:
            return await bot.run_code(run_id, "echo $((6 * 7))", language="bash")

    answer = anyio.run(scenario)
    assert answer.stdout == "42\n" and answer.kernel.language == "bash"


def test_the_official_mcp_client_gets_progress_and_the_result(api: Api) -> None:
    run_id = api.run(api.session())
    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async def scenario() -> dict:
        async with run_session(api.url, run_id, API_TOKEN) as (mcp, _):
            listed = {tool.name for tool in (await mcp.list_tools()).tools}
            assert {"run_code", "kernel_list", "kernel_restart", "kernel_shutdown"} <= listed
            code = "import time\nprint('first', flush=True)\ntime.sleep(1)\n6 * 7"
            result = await mcp.call_tool("run_code", {"code": code}, progress_callback=on_progress)
            return result.structured_content

    answer = anyio.run(scenario)
    assert answer["status"] == "ok" and answer["text"] == "42" and answer["stdout"] == "first\n"
    assert any(message and "first" in message for message in progress), progress
    assert progress[-1] and progress[-1].startswith("run_code done"), progress


def test_a_kernel_survives_pause_and_resume(api: Api) -> None:
    """The sandbox is frozen with its idle kernel (docker pause, the process backend's
    cgroup.freeze) and the kernel works after the next call resumed it, its state intact."""
    from orchestrator.sandboxes.docker import DockerBackend
    from orchestrator.sandboxes.process import ProcessBackend

    kind = DockerBackend if api.backend == "docker" else ProcessBackend
    backend = api.service.sandboxes.backend_named(api.backend, kind)
    assert backend is not None
    run_id = api.run(api.session("oc_pause_kernels"))
    api.ok(run_id, "run_code", code="kept = [1, 2, 3]")
    backend.reap_idle(now=time.monotonic() + PAUSE_AFTER_S + 1)  # idle past the pause time, before the stop
    assert "paused" in [status.state for status in backend.status()], backend.status()
    answer = api.ok(run_id, "run_code", code="sum(kept)")
    assert answer["text"] == "6" and answer["kernel_restarted"] is False


def test_a_kernel_cannot_forge_the_drivers_protocol(api: Api) -> None:
    """Attack: code writes a protocol line ("done") to fd 1 and an image event, hoping to end
    the call early or have the agent write a file. What a kernel writes to fd 1 is its output
    (ipykernel forwards it), never a line of the driver's protocol."""
    run_id = api.run(api.session())
    forged = (
        "import os, time\n"
        "os.write(1, b'{\"ev\": \"done\", \"status\": \"ok\"}\\n')\n"
        "os.write(1, b'{\"ev\": \"display\", \"data\": {\"image/svg+xml\": \"<svg/>\"}}\\n')\n"
        "time.sleep(0.5)\n"
        "print('the real end')"
    )
    answer = api.ok(run_id, "run_code", code=forged)
    assert answer["status"] == "ok" and answer["stdout"].endswith("the real end\n") and answer["images"] == []


def test_a_planted_outputs_link_gets_no_image(api: Api) -> None:
    """Attack: the user replaces the session's outputs/ with a link to a directory outside its
    roots; the chart is then not written anywhere, and the answer says so."""
    run_id = api.run(api.session())
    api.ok(run_id, "shell", command="rm -rf outputs && ln -s /etc outputs")
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"
    answer = api.ok(run_id, "run_code", code=code)
    assert answer["status"] == "ok" and answer["images"] == [] and "not writable" in answer["note"]
    assert not any(name.endswith(".png") for name in os.listdir("/etc"))


def test_a_stopped_sandbox_takes_its_kernels_along(api: Api) -> None:
    """Idle past the stop: the sandbox stops and its kernels (and what they started) die with
    it; the next call starts a fresh sandbox and a fresh kernel."""
    from orchestrator.sandboxes.docker import DockerBackend
    from orchestrator.sandboxes.process import ProcessBackend

    kind = DockerBackend if api.backend == "docker" else ProcessBackend
    backend = api.service.sandboxes.backend_named(api.backend, kind)
    assert backend is not None
    run_id = api.run(api.session("oc_stop_kernels"))
    api.ok(run_id, "run_code", code="import subprocess; gone = 1; p = subprocess.Popen(['sleep', '300'])")
    pids = api.ok(run_id, "run_code", code="import os; print(os.getpid(), p.pid)")["stdout"].split()
    backend.reap_idle(now=time.monotonic() + 901)  # past ORCH_IDLE_TIMEOUT_S (900)
    assert all(status.state == "stopped" for status in backend.status()), backend.status()
    if api.backend == "process":  # host pids: nothing of the kernel is left
        assert not any(Path(f"/proc/{pid}").exists() for pid in pids), pids
    after = api.ok(run_id, "run_code", code="'gone' in globals()")
    assert after["text"] == "False"
