"""The docker backend against a real engine. Prints `name: value unit` lines.

1. Cold start: create-to-ready (`DockerBackend.ensure` of a user without a container: create,
   start, the agent answering /health on its socket) for several new users; median.
2. Warm call: a small `read_file` through a real `orchestrator serve` (uvicorn on loopback,
   ORCH_BACKEND=docker) to the user's container, and `docker exec <container> cat <file>` of
   the same file in the same run; medians and their ratio.
3. Load: 50 sessions of 50 different users (50 containers) x 20 tool calls in parallel
   through the API: errors, p50, p99.

`runtimes`: runc and runsc (gVisor) side by side through a real `orchestrator serve` each:
the first call of a new user (the container's cold start), a warm `read_file`, a `shell`
echo, 20,000 stat calls timed inside the sandbox, and a `pip install` of one small wheel
through the egress proxy (it reaches the package registry). Needs runsc registered with
dockerd (deploy/docker/register-runsc); ORCH_SANDBOX_UID_BASE / ORCH_MAX_USER_ID are passed on.

Run: .venv/bin/python bench/docker_backend.py [runtimes]   (builds or reuses the image first)
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker
import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.measure import BENCH_ROOT, orchestrator_server, pct, print_load, timed_parallel  # noqa: E402
from mounts.plan import plan_mounts  # noqa: E402
from orchestrator.sandboxes.base import SandboxUser  # noqa: E402
from orchestrator.sandboxes.docker_spec import LABEL_INSTANCE, instance_id  # noqa: E402
from orchestrator.sandboxes.image.build import BuildSources, ImageBuilder  # noqa: E402
from orchestrator.service import OrchestratorService  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402

COLD_USERS = 9
WARM_CALLS = 1000
EXEC_CALLS = 30
SESSIONS, CALLS_PER_SESSION = 50, 20
# Not under /tmp: a user's tmp/{uid} is the container's /tmp (see docs/docker.md).
BASE = BENCH_ROOT / "docker"


def remove_containers(engine: docker.DockerClient, data_dir: Path) -> None:
    for container in engine.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance_id(data_dir)}"}):
        container.remove(force=True)


def image_ref(engine: docker.DockerClient) -> str:
    result = ImageBuilder(engine, BuildSources.from_checkout(REPO), image=Settings().sandbox_image).build()
    print(f"image_ready: {result.seconds:.2f} s ({'built' if result.built else 'reused'})")
    return f"{result.image.rpartition(':')[0]}:{result.recipe[:12]}"


def cold_start_samples(settings: Settings, backend_name: str, users: int) -> list[float]:
    """Seconds of `backend.ensure` for `users` new users one after another."""
    service = OrchestratorService(settings)
    backend = service.sandboxes.backends.get(backend_name)
    assert backend is not None, backend_name
    try:
        service.agent_deployment.ensure()  # deploying the agent code is not part of a start
        samples = []
        for user_id in range(1, users + 1):
            service.users.upsert(user_id, display_name=None, backend=None)
            user = SandboxUser(user_id, plan_mounts(service.layout, user_id))
            t0 = time.perf_counter()
            backend.ensure(user)
            samples.append(time.perf_counter() - t0)
        return samples
    finally:
        service.close()


def cold_starts(data_dir: Path, image: str) -> None:
    settings = Settings(data_dir=data_dir, backend="docker", sandbox_image=image)
    samples = cold_start_samples(settings, "docker", COLD_USERS)
    print(f"cold_start_median: {statistics.median(samples):.3f} s")
    print(f"cold_start_max: {max(samples):.3f} s")


def through_the_api(data_dir: Path, image: str, engine: docker.DockerClient) -> None:
    settings = {"ORCH_DATA_DIR": str(data_dir), "ORCH_BACKEND": "docker", "ORCH_SANDBOX_IMAGE": image}
    limits = httpx.Limits(max_connections=SESSIONS + 10, max_keepalive_connections=SESSIONS + 10)
    with orchestrator_server(settings, limits=limits) as server:
        if server.health["backend"] != "docker":
            raise SystemExit(f"the server did not pick docker: {server.health}")
        new_run, call = server.new_run, server.result
        run = new_run(17)
        t0 = time.perf_counter()
        path = call(run["run_id"], "write_file", path="small.txt", content="hello\n" * 10)["path"]
        print(f"first_call_with_container_start: {1000 * (time.perf_counter() - t0):.0f} ms")
        for _ in range(100):
            call(run["run_id"], "read_file", path="small.txt")
        api_samples = []
        for _ in range(WARM_CALLS):
            t0 = time.perf_counter()
            call(run["run_id"], "read_file", path="small.txt")
            api_samples.append((time.perf_counter() - t0) * 1000)
        container = next(
            c.name for c in engine.containers.list(filters={"label": f"{LABEL_INSTANCE}={instance_id(data_dir)}"})
        )
        exec_samples = []
        for _ in range(EXEC_CALLS):
            t0 = time.perf_counter()
            subprocess.run(["docker", "exec", container, "cat", path], check=True, capture_output=True)
            exec_samples.append((time.perf_counter() - t0) * 1000)
        api_median, exec_median = statistics.median(api_samples), statistics.median(exec_samples)
        print(f"read_file_api_median: {api_median:.3f} ms")
        print(f"read_file_api_p99: {pct(api_samples, 0.99):.3f} ms")
        print(f"docker_exec_cat_median: {exec_median:.1f} ms")
        print(f"api_vs_docker_exec_ratio: {exec_median / api_median:.0f} x")

        runs = [new_run(1000 + i) for i in range(SESSIONS)]  # 50 different users
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(SESSIONS) as pool:
            list(pool.map(lambda r: call(r["run_id"], "write_file", path="small.txt", content="x\n"), runs))
        print(f"start_{SESSIONS}_containers_in_parallel: {time.perf_counter() - t0:.1f} s")
        latencies: list[float] = []
        errors: list[str] = []

        def session_work(r: dict) -> None:
            for i in range(CALLS_PER_SESSION):
                t0 = time.perf_counter()
                try:
                    if i % 4 == 3:
                        call(r["run_id"], "list_dir", path=".")
                    elif i % 10 == 9:
                        call(r["run_id"], "shell", command="echo hi")
                    else:
                        call(r["run_id"], "read_file", path="small.txt")
                except Exception as exc:
                    errors.append(repr(exc)[:200])
                latencies.append((time.perf_counter() - t0) * 1000)

        wall = timed_parallel(session_work, runs)
        label = f"parallel_{SESSIONS}_users_x{CALLS_PER_SESSION}"
        print_load(label, latencies, errors, wall)
        for error in errors[:3]:
            print(f"# error: {error}")


RUNTIME_COLD_USERS = 3
RUNTIME_WARM_CALLS = 200
RUNTIME_SHELL_CALLS = 30
RUNTIME_PIP_INSTALLS = 2
STAT_LOOP = (
    "python3 -c \"import os, time; t = time.perf_counter(); [os.stat('/tmp') for _ in range(20000)]; "
    "print(round(1000 * (time.perf_counter() - t)))\""
)


def one_runtime(runtime: str, data_dir: Path, image: str) -> dict[str, float]:
    settings = {"ORCH_DATA_DIR": str(data_dir), "ORCH_BACKEND": "docker", "ORCH_SANDBOX_IMAGE": image,
                "ORCH_SANDBOX_RUNTIME": runtime}  # fmt: skip
    for name in ("ORCH_SANDBOX_UID_BASE", "ORCH_MAX_USER_ID"):  # the caller's uid block, if any
        if name in os.environ:
            settings[name] = os.environ[name]
    with orchestrator_server(settings) as server:
        if server.health["kernel_boundary"]["docker"]["runtime"] != runtime:
            raise SystemExit(f"the server did not take ORCH_SANDBOX_RUNTIME={runtime}: {server.health}")
        call = server.result
        cold = []
        for user_id in range(1, RUNTIME_COLD_USERS + 1):
            run = server.new_run(user_id)
            t0 = time.perf_counter()
            call(run["run_id"], "write_file", path="small.txt", content="hello\n" * 10)
            cold.append(time.perf_counter() - t0)
        for _ in range(20):
            call(run["run_id"], "read_file", path="small.txt")
        reads = []
        for _ in range(RUNTIME_WARM_CALLS):
            t0 = time.perf_counter()
            call(run["run_id"], "read_file", path="small.txt")
            reads.append((time.perf_counter() - t0) * 1000)
        shells = []
        for _ in range(RUNTIME_SHELL_CALLS):
            t0 = time.perf_counter()
            call(run["run_id"], "shell", command="echo hi")
            shells.append((time.perf_counter() - t0) * 1000)
        stat_ms = float(call(run["run_id"], "shell", command=STAT_LOOP)["stdout"])
        pips = []
        for i in range(RUNTIME_PIP_INSTALLS):
            command = f"pip install --no-cache-dir --target /tmp/pip-bench-{i} six 2>&1 | tail -1"
            t0 = time.perf_counter()
            out = call(run["run_id"], "shell", command=command, timeout_s=240)
            pips.append(time.perf_counter() - t0)
            if "Successfully installed six" not in out["stdout"]:
                raise RuntimeError(f"pip install failed under {runtime}: {out}")
    return {
        "cold_start_median_s": statistics.median(cold),
        "read_file_median_ms": statistics.median(reads),
        "shell_echo_median_ms": statistics.median(shells),
        "stat_20000_ms": stat_ms,
        "pip_install_six_median_s": statistics.median(pips),
    }


def runtimes(base: Path, image: str) -> None:
    results = {runtime: one_runtime(runtime, base / runtime / "data", image) for runtime in ("runc", "runsc")}
    for key in results["runc"]:
        name, unit = key.rsplit("_", 1)
        runc, runsc = results["runc"][key], results["runsc"][key]
        print(f"runc_{name}: {runc:.3f} {unit}")
        print(f"runsc_{name}: {runsc:.3f} {unit}")
        print(f"runsc_vs_runc_{name}: {runsc / runc:.1f} x")


def main() -> None:
    BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(dir=BASE, prefix="run-"))
    os.chmod(base, 0o711)
    engine = docker.from_env(timeout=300)
    cold_dir, api_dir = base / "cold" / "data", base / "api" / "data"
    compare = sys.argv[1:] == ["runtimes"]
    data_dirs = [base / "runc" / "data", base / "runsc" / "data"] if compare else [cold_dir, api_dir]
    try:
        image = image_ref(engine)
        if compare:
            runtimes(base, image)
        else:
            cold_starts(cold_dir, image)
            through_the_api(api_dir, image, engine)
    finally:
        for data_dir in data_dirs:
            remove_containers(engine, data_dir)
        engine.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
