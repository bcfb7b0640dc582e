"""Resume of a paused sandbox to a served `read_file`, next to a cold start, in one run.

In-process, on the real backends (an `OrchestratorService` on a fresh data dir, the router's
one call protocol, real agents; docker with the real engine): for each backend, alternately
- pause the user's idle sandbox (the reaper's own `reap_idle`, as of a moment past
  ORCH_PAUSE_AFTER_S) and time the next `read_file` (it resumes the sandbox first);
- stop the sandbox and time the next `read_file` (a cold start: docker starts the stopped
  container, the process backend starts a new agent).
Prints median and p99 of each (target for resume: at most 100 ms).

Run: .venv/bin/python bench/pause.py [--backend docker|process|both] [--rounds N]
(prints `name: value unit` lines; honours ORCH_SANDBOX_UID_BASE / ORCH_MAX_USER_ID of the
environment, so a shared host's uid blocks stay apart)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.measure import bench_dir, pct  # noqa: E402
from mounts.plan import plan_mounts  # noqa: E402
from orchestrator.sandboxes.base import SandboxUser  # noqa: E402
from orchestrator.sandboxes.calling import SandboxCaller  # noqa: E402
from orchestrator.service import OrchestratorService  # noqa: E402
from orchestrator.settings import CallSettings, load_settings  # noqa: E402
from sandbox_agent.client import blocking  # noqa: E402

USER = 17


def measure(backend_name: str, rounds: int) -> dict[str, list[float]]:
    base = bench_dir(f"pause-{backend_name}-")
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    settings = load_settings(data_dir=data, backend=backend_name, pause_after_s=1.0, idle_timeout_s=3600.0)
    service = OrchestratorService(settings)
    samples: dict[str, list[float]] = {"resume": [], "cold": []}
    try:
        service.users.upsert(USER, display_name=None, backend=None)
        backend = service.sandboxes.backends[backend_name]
        user = SandboxUser(USER, plan_mounts(service.layout, USER, [], {}))
        cwd = str(service.directories.ensure_session_runtime(USER, "s1", is_owner=True))
        caller = SandboxCaller(CallSettings.of(settings))

        def read() -> float:
            t0 = time.perf_counter()
            answer = blocking(caller.call(backend, user, "read_file", {"path": "b.txt"}, cwd=cwd))
            assert "bench" in str(answer), answer
            return (time.perf_counter() - t0) * 1000

        blocking(caller.call(backend, user, "write_file", {"path": "b.txt", "content": "bench\n"}, cwd=cwd))
        for _ in range(5):
            read()
        for _ in range(rounds):
            backend.reap_idle(now=time.monotonic() + settings.pause_after_s + 0.5)
            assert [s.state for s in backend.status()] == ["paused"], backend.status()
            samples["resume"].append(read())
            backend.stop(USER)
            samples["cold"].append(read())
    finally:
        service.close()
        if backend_name == "docker":
            import docker

            from orchestrator.sandboxes.docker_spec import LABEL_INSTANCE, instance_id

            engine = docker.from_env()
            for container in engine.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance_id(data)}"}):
                container.remove(force=True)
            engine.close()
        shutil.rmtree(base, ignore_errors=True)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["docker", "process", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    backends = ["docker", "process"] if args.backend == "both" else [args.backend]
    for name in backends:
        samples = measure(name, args.rounds)
        for kind in ("resume", "cold"):
            print(f"{name}_{kind}_read_file_median: {statistics.median(samples[kind]):.1f} ms")
            print(f"{name}_{kind}_read_file_p99: {pct(samples[kind], 0.99):.1f} ms")
        ratio = statistics.median(samples["cold"]) / statistics.median(samples["resume"])
        print(f"{name}_cold_over_resume_ratio: {ratio:.1f} x")


if __name__ == "__main__":
    main()
