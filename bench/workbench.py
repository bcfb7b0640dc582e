"""The workbench image next to the previous default image, same run. Prints `name: value unit`.

1. Image size (`docker image inspect`) of both.
2. Cold start: the first tool call of a new user (a `read_file` the agent answers: create,
   start, agent ready, call), through the API in-process; the two images alternate user by
   user so load affects both alike; medians.
3. A template's build (figlet from Debian, tabulate from PyPI, a file of its own so the recipe
   is new): cold (fetch + build) and cached (the same recipe again: its image exists).
4. Time to a first chart for a new user: with the previous image `pip install pandas
   matplotlib` through the egress proxy into deps/{uid} then the script; with the workbench
   image the script alone. Both from nothing (the cold start included). Reaches PyPI and
   Debian's mirror; sandboxes reach nothing else.

Run: .venv/bin/python -m bench.workbench --previous IMAGE --workbench IMAGE   (as a module: bench/mcp.py
would shadow the mcp package)
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import time
from pathlib import Path

import docker
from fastapi.testclient import TestClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.measure import bench_dir  # noqa: E402
from orchestrator.http.app import create_app  # noqa: E402
from orchestrator.sandboxes.docker_spec import LABEL_INSTANCE, instance_id  # noqa: E402
from orchestrator.service import OrchestratorService  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402
from orchestrator.templates.recipe import recipe_of  # noqa: E402
from tests.uid_block import block as block_of, claim_for_this_run  # noqa: E402

TOKEN, ADMIN = "bench-bot-token", "bench-admin-token"
COLD_USERS = 5
CHART = (
    "import pandas as pd, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
    "ax = pd.DataFrame({'x': [1, 2, 3], 'y': [2, 4, 8]}).plot(x='x', y='y'); ax.figure.savefig('chart.png')\n"
)


def served(data: Path, image: str, index: int) -> tuple[OrchestratorService, TestClient]:
    """A server of its own per image (each its own uid block: the run's span, tests/uid_block.py)."""
    data.mkdir()
    block = block_of(index + 1)
    settings = Settings(data_dir=data, api_token=TOKEN, admin_token=ADMIN, public_base_url="http://bench",
                        backend="docker", sandbox_image=image, disk_quota="off", **block)  # type: ignore[arg-type]  # fmt: skip
    service = OrchestratorService(settings)
    client = TestClient(create_app(service), headers={"Authorization": f"Bearer {TOKEN}"})
    client.__enter__()
    return service, client


def new_run(client: TestClient, user_id: int) -> str:
    client.put(f"/v1/users/{user_id}", json={})
    session = client.post("/v1/sessions", json={"owner_user_id": user_id, "channel": "web"}).json()["session_id"]
    return client.post(f"/v1/sessions/{session}/runs", json={"trigger": "web"}).json()["run_id"]


def call(client: TestClient, run_id: str, name: str, **arguments: object) -> dict:
    answer = client.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments}).json()
    return answer


def cold_start(client: TestClient, user_id: int) -> float:
    run_id = new_run(client, user_id)
    t0 = time.perf_counter()
    answer = call(client, run_id, "read_file", path="missing.txt")
    seconds = time.perf_counter() - t0
    assert answer.get("error", {}).get("code") == "not_found", answer  # the agent answered
    return seconds


def first_chart(client: TestClient, user_id: int, service: OrchestratorService, *, install: bool) -> float:
    run_id = new_run(client, user_id)
    deps = service.layout.deps_dir(user_id)
    command = (f"pip install -q --target {deps}/pip pandas matplotlib && " if install else "") + f'python3 -c "{CHART}"'
    t0 = time.perf_counter()
    answer = call(client, run_id, "shell", command=command, timeout_s=600)
    seconds = time.perf_counter() - t0
    assert answer["ok"] and answer["result"]["exit_code"] == 0, answer
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--previous", required=True)
    parser.add_argument("--workbench", required=True)
    args = parser.parse_args()
    engine = docker.from_env()
    for label, image in (("previous", args.previous), ("workbench", args.workbench)):
        print(f"image_size_{label}: {engine.images.get(image).attrs['Size'] / 1e6:.0f} MB")

    base = bench_dir("workbench-")
    claim_for_this_run()
    pairs = {label: served(base / label, image, index)
             for index, (label, image) in enumerate((("previous", args.previous), ("workbench", args.workbench)))}  # fmt: skip
    try:
        samples: dict[str, list[float]] = {"previous": [], "workbench": []}
        for user_id in range(1, COLD_USERS + 1):
            for label, (_, client) in pairs.items():
                samples[label].append(cold_start(client, user_id))
        for label, values in samples.items():
            print(f"cold_start_{label}_median: {statistics.median(values):.3f} s (of {len(values)})")
        ratio = statistics.median(samples["workbench"]) / statistics.median(samples["previous"])
        print(f"cold_start_workbench_over_previous: {ratio:.3f} x")

        service, client = pairs["workbench"]
        recipe = recipe_of(name="bench", apt=["figlet"], pip=["tabulate==0.9.0"],
                           files={"/etc/bench-template": secrets.token_hex(8)})  # fmt: skip
        for label in ("cold", "cached"):
            if label == "cached":
                service.templates.delete("bench")  # the record goes; the image (by its hash) stays
            t0 = time.perf_counter()
            service.templates.put("bench", recipe)
            service.templates.wait("bench")
            record = service.templates.get("bench")
            assert record.status == "ready", record.log[-2000:]
            print(f"template_build_{label}: {time.perf_counter() - t0:.2f} s")
        engine.images.remove(record.image or "", force=True)

        print(f"first_chart_previous: {first_chart(pairs['previous'][1], 50, pairs['previous'][0], install=True):.1f} s")
        print(f"first_chart_workbench: {first_chart(client, 50, service, install=False):.1f} s")
    finally:
        for label, (service, client) in pairs.items():
            client.__exit__(None, None, None)
            service.close()
            for container in engine.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance_id(base / label)}"}):
                container.remove(force=True)
        shutil.rmtree(base, ignore_errors=True)
        engine.close()


if __name__ == "__main__":
    os.umask(0o022)
    main()
