"""The kubernetes backend against a real cluster, next to the docker backend in the same run.
Prints `name: value unit` lines.

1. Cold start: create-to-ready (`ensure` of a user without a sandbox: the pod created,
   scheduled, started, its agent answering /health through the API's port-forward) for a few
   new users, and the same for docker containers; medians and their ratio.
2. Warm call: a small `read_file` through a real `orchestrator serve` to the user's pod
   (ORCH_BACKEND=kubernetes) and to its container (ORCH_BACKEND=docker); medians, p99, ratio.
   Then the same call after an idle pause longer than the agent pool's REUSE_IDLE_S (each
   such call opens a new connection: for a pod, a new port-forward), and the bare cost of
   opening a port-forward to the agent.
3. Load: 20 users (20 pods) x 20 calls in parallel through the API on kubernetes: errors,
   p50, p99.

Small sandboxes so 20 pods fit beside other work on a two-core node (pods request what they
limit): 0.05 CPU and 128 MiB for the load, 0.2 CPU for the warm comparison (at 0.05 CPU the
CFS quota, 5 ms per 100 ms period, throttles back-to-back calls on both backends alike).

Run (the local cluster of deploy/kubernetes/local, or ORCH_BENCH_KUBECONFIG):
    .venv/bin/python bench/kubernetes.py
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Run as a script, bench/ is sys.path[0] and this file would shadow the `kubernetes` package.
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]

import docker  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

from bench.docker_backend import cold_start_samples, image_ref, remove_containers  # noqa: E402
from bench.measure import bench_dir, orchestrator_server, pct, print_load, timed_parallel  # noqa: E402
from orchestrator.sandboxes.kubernetes_api import kube_configuration  # noqa: E402
from orchestrator.sandboxes.kubernetes_forward import PodPortForwarder  # noqa: E402
from orchestrator.settings import KubernetesSettings, Settings  # noqa: E402
from tests.kube_cluster import load_image_into_node  # noqa: E402

KUBECONFIG = Path(os.environ.get("ORCH_BENCH_KUBECONFIG") or "/tmp/k8s-local/k8s/kubeconfig")
COLD_USERS = 4
WARM_CALLS = 500
IDLE_CALLS = 5
CONNECTS = 30
USERS, CALLS_PER_USER = 20, 20
WARM = {"ORCH_SANDBOX_CPUS": "0.2", "ORCH_SANDBOX_MEMORY_MB": "256"}
SMALL = {"ORCH_SANDBOX_CPUS": "0.05", "ORCH_SANDBOX_MEMORY_MB": "128"}


# A run's own uid block (an agent sweeps every process of its uid): passed on to the servers.
KEPT = {k: v for k, v in os.environ.items() if k in ("ORCH_SANDBOX_UID_BASE", "ORCH_MAX_USER_ID")}


def kube_env(namespace: str, image: str) -> dict[str, str]:
    return {
        **KEPT,
        "ORCH_BACKEND": "kubernetes",
        "ORCH_K8S_KUBECONFIG": str(KUBECONFIG),
        "ORCH_K8S_NAMESPACE": namespace,
        "ORCH_K8S_IMAGE_PULL_POLICY": "Never",
        "ORCH_SANDBOX_IMAGE": image,
    }


def settings_of(data_dir: Path, env: dict[str, str]) -> Settings:
    fields = {k.removeprefix("ORCH_").lower(): v for k, v in env.items()}
    # No disk quotas (as the servers of bench/measure.py): as root `auto` would leave loop
    # images mounted in the data dir after the run.
    return Settings(data_dir=data_dir, **{"disk_quota": "off", **fields})


def warm_calls(data_dir: Path, env: dict[str, str], backend_name: str) -> tuple[list[float], list[float]]:
    """(back-to-back read_file latencies, latencies after an idle pause), in ms."""
    with orchestrator_server({"ORCH_DATA_DIR": str(data_dir), **env}) as server:
        if server.health["backend"] != backend_name:
            raise SystemExit(f"the server did not pick {backend_name}: {server.health}")
        run = server.new_run(17)
        server.result(run["run_id"], "write_file", path="small.txt", content="hello\n" * 10)
        for _ in range(50):
            server.result(run["run_id"], "read_file", path="small.txt")
        samples = []
        for _ in range(WARM_CALLS):
            t0 = time.perf_counter()
            server.result(run["run_id"], "read_file", path="small.txt")
            samples.append((time.perf_counter() - t0) * 1000)
        after_idle = []
        for _ in range(IDLE_CALLS):
            time.sleep(3.5)  # > REUSE_IDLE_S (sandbox_agent/client.py): the pooled connection is not reused
            t0 = time.perf_counter()
            server.result(run["run_id"], "read_file", path="small.txt")
            after_idle.append((time.perf_counter() - t0) * 1000)
        return samples, after_idle


def forward_connects(namespace: str, image: str, data_dir: Path) -> list[float]:
    """Opening (and closing) a port-forward to a running pod's agent port, in ms."""
    configuration = kube_configuration(KubernetesSettings.of(settings_of(data_dir, kube_env(namespace, image))))
    with k8s.ApiClient(configuration) as api:
        pod = k8s.CoreV1Api(api).list_namespaced_pod(namespace).items[0].metadata.name
    forwarder = PodPortForwarder(configuration, namespace, pod, Settings().k8s_agent_port)
    samples = []
    for _ in range(CONNECTS):
        t0 = time.perf_counter()
        sock = forwarder(10.0)
        samples.append((time.perf_counter() - t0) * 1000)
        sock.close()
    return samples


def parallel_load(data_dir: Path, env: dict[str, str]) -> None:
    import httpx

    limits = httpx.Limits(max_connections=USERS + 10, max_keepalive_connections=USERS + 10)
    with orchestrator_server({"ORCH_DATA_DIR": str(data_dir), **env}, limits=limits, timeout=120) as server:
        runs = [server.new_run(1000 + i) for i in range(USERS)]
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(USERS) as pool:
            started = list(pool.map(lambda r: server.tool(r["run_id"], "write_file", path="small.txt", content="x\n"), runs))
        print(f"kubernetes_start_{USERS}_pods_in_parallel: {time.perf_counter() - t0:.1f} s")
        start_errors = [s for s in started if not s.get("ok")]
        print(f"kubernetes_start_{USERS}_pods_errors: {len(start_errors)} pods")
        latencies: list[float] = []
        by_tool: dict[str, list[float]] = {}
        first_calls: list[float] = []
        errors: list[str] = []

        def user_work(r: dict) -> None:
            for i in range(CALLS_PER_USER):
                name, arguments = (
                    ("list_dir", {"path": "."}) if i % 4 == 3
                    else ("shell", {"command": "echo hi"}) if i % 10 == 9
                    else ("read_file", {"path": "small.txt"})
                )  # fmt: skip
                t0 = time.perf_counter()
                try:
                    server.result(r["run_id"], name, **arguments)
                except Exception as exc:
                    errors.append(repr(exc)[:300])
                ms = (time.perf_counter() - t0) * 1000
                latencies.append(ms)
                by_tool.setdefault(name, []).append(ms)
                if i == 0:
                    first_calls.append(ms)

        wall = timed_parallel(user_work, runs)
        label = f"kubernetes_parallel_{USERS}_users_x{CALLS_PER_USER}"
        print_load(label, latencies, errors, wall)
        for name, samples in sorted(by_tool.items()):
            print(f"{label}_{name}_p50: {statistics.median(samples):.2f} ms")
            print(f"{label}_{name}_p99: {pct(samples, 0.99):.2f} ms")
        print(f"{label}_first_call_of_each_user_max: {max(first_calls):.0f} ms")
        for error in (start_errors + errors)[:3]:
            print(f"# error: {error}")


def report_pair(name: str, kube: list[float], dock: list[float], unit: str, digits: int = 2) -> None:
    k, d = statistics.median(kube), statistics.median(dock)
    print(f"kubernetes_{name}_median: {k:.{digits}f} {unit}")
    print(f"docker_{name}_median: {d:.{digits}f} {unit}")
    print(f"kubernetes_vs_docker_{name}_ratio: {k / d:.2f} x")


def main() -> None:
    engine = docker.from_env(timeout=300)
    base = bench_dir("kubernetes-")
    configuration = k8s.Configuration()
    from kubernetes import config as k8s_config

    k8s_config.load_kube_config(config_file=str(KUBECONFIG), client_configuration=configuration)
    api = k8s.ApiClient(configuration)
    core = k8s.CoreV1Api(api)
    namespace = f"so-bench-{secrets.token_hex(4)}"
    core.create_namespace({"metadata": {"name": namespace}})
    dirs = {name: base / name / "data" for name in ("kcold", "dcold", "kwarm", "dwarm", "kload")}
    try:
        image = image_ref(engine)
        load_image_into_node(image)
        kube, dock = kube_env(namespace, image), {**KEPT, "ORCH_BACKEND": "docker", "ORCH_SANDBOX_IMAGE": image}
        if sys.argv[1:] == ["load"]:  # only part 3
            parallel_load(dirs["kload"], {**kube, **SMALL})
            return

        k_cold = cold_start_samples(settings_of(dirs["kcold"], {**kube, **WARM}), "kubernetes", COLD_USERS)
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        d_cold = cold_start_samples(settings_of(dirs["dcold"], {**dock, **WARM}), "docker", COLD_USERS)
        remove_containers(engine, dirs["dcold"])
        report_pair("cold_start", k_cold, d_cold, "s", 3)
        print(f"kubernetes_cold_start_max: {max(k_cold):.3f} s")

        k_warm, k_idle = warm_calls(dirs["kwarm"], {**kube, **WARM}, "kubernetes")
        connects = forward_connects(namespace, image, dirs["kwarm"])
        d_warm, d_idle = warm_calls(dirs["dwarm"], {**dock, **WARM}, "docker")
        report_pair("read_file_api", k_warm, d_warm, "ms")
        print(f"kubernetes_read_file_api_p99: {pct(k_warm, 0.99):.2f} ms")
        print(f"docker_read_file_api_p99: {pct(d_warm, 0.99):.2f} ms")
        report_pair("read_file_after_idle", k_idle, d_idle, "ms")
        print(f"kubernetes_portforward_open_median: {statistics.median(connects):.1f} ms")
        print(f"kubernetes_portforward_open_p99: {pct(connects, 0.99):.1f} ms")
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        remove_containers(engine, dirs["dwarm"])

        parallel_load(dirs["kload"], {**kube, **SMALL})
    finally:
        try:
            core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
            core.delete_namespace(namespace, grace_period_seconds=0)
        finally:
            api.close()
            for data_dir in dirs.values():
                remove_containers(engine, data_dir)
            engine.close()
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
