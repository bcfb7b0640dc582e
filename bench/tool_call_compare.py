"""Tool-call latency of this tree and of an earlier revision, side by side in one run.

Starts two real `orchestrator serve` processes (uvicorn on loopback): one from this checkout,
one from `git archive REV` of the same repository, each with its own data dir and agents,
both on the same interpreter. Then alternates blocks of calls between them, so both see the
same machine load:
1. a small `read_file` through `POST /v1/runs/{id}/tools/read_file` (median, p99), and the
   same call straight to each one's agent over its Unix socket (the agent's share); and a
   small `shell` call (`echo hello`);
   a small `read_bytes` (read whole, as it always was);
2. `send_file` of a 1 MiB file by path (the sandbox's `read_bytes` and the delivery), and
   `read_bytes` of that file through the API (at 1 MiB it streams: docs/lifecycle.md);
3. with `--backend docker`, `docker exec <container> cat <file>` as the reference (targets: docs/performance.md).

Run: .venv/bin/python bench/tool_call_compare.py [--baseline REV] [--backend process|docker]
(prints `name: value unit` lines; `baseline_*` and `current_*` figures come from the same run)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.measure import BenchServer, bench_dir, orchestrator_server, pct  # noqa: E402
from sandbox_agent.client import AgentClient  # noqa: E402

BLOCK = 25
SIZE = 1024 * 1024


def export_revision(rev: str, into: Path) -> Path:
    """The tree of `rev` as plain files (no worktree bookkeeping left behind)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    target = into / f"tree-{rev.replace('/', '_')}"
    target.mkdir()
    archive_file = into / "tree.tar"
    archive_file.write_bytes(archive)
    with tarfile.open(archive_file) as tar:
        tar.extractall(target, filter="data")
    archive_file.unlink()
    return target


# BENCH_UID_OFFSET moves both blocks, when other instances on this host hold these uids.
UID_BASES = {name: base + int(os.environ.get("BENCH_UID_OFFSET", "0")) for name, base in {"baseline": 300_000_000, "current": 100_000}.items()}


@dataclass
class Server:
    name: str
    tree: Path
    data_dir: Path
    backend: str
    image: str | None
    python: str = sys.executable
    server: BenchServer | None = None
    stack: ExitStack = field(default_factory=ExitStack)
    run: dict = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)

    def start(self) -> None:
        settings = {"ORCH_DATA_DIR": str(self.data_dir), "ORCH_BACKEND": self.backend}
        # Two servers on one host must not share sandbox uids: an agent sweeps every process of
        # its uid when a call ends, and would kill the other server's agent of the same user.
        settings["ORCH_SANDBOX_UID_BASE"] = str(UID_BASES[self.name])
        settings["ORCH_MAX_USER_ID"] = "1000"  # disjoint uid blocks: both servers may claim theirs
        if self.image is not None:
            settings["ORCH_SANDBOX_IMAGE"] = self.image
        served = orchestrator_server(settings, python=self.python, cwd=self.tree, what=f"the {self.name} server")
        self.server = self.stack.enter_context(served)
        self.run = self.server.new_run(17)
        self.call("write_file", path="small.txt", content="hello\n" * 10)
        self.call("shell", command=f"head -c {SIZE} /dev/urandom > big.bin")
        for _ in range(100):
            self.call("read_file", path="small.txt")

    def call(self, name: str, **arguments: object) -> dict:
        assert self.server is not None
        return self.server.result(self.run["run_id"], name, **arguments)

    def timed(self, figure: str, fn) -> None:
        t0 = time.perf_counter()
        fn()
        self.samples.setdefault(figure, []).append((time.perf_counter() - t0) * 1000)

    def agent(self) -> AgentClient:
        sockets = self.data_dir / "sockets" / "17"
        # This tree keeps the token in agent-secrets/; a baseline from before that, beside the socket.
        secret = self.data_dir / "agent-secrets" / "17" / "token"
        token = (secret if secret.exists() else sockets / "token").read_text().strip()
        return AgentClient(sockets / "agent.sock", token)

    def containers(self) -> list:
        import docker

        from orchestrator.sandboxes.docker_spec import LABEL_INSTANCE, instance_id

        engine = docker.from_env()
        try:
            return engine.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance_id(self.data_dir)}"})
        finally:
            engine.close()

    def container(self) -> str:
        return self.containers()[0].name

    def stop(self) -> None:
        self.stack.close()
        if self.backend == "docker":  # sandboxes outlive the orchestrator by design; not the bench's
            for container in self.containers():
                container.remove(force=True)


def docker_image(tree: Path) -> str:
    """The sandbox image of `tree`'s recipe (each tree's agent needs its own runtime in the
    image: the baseline's may import FastAPI), reused when one with that recipe exists. Tagged
    under its own name, so `ORCH_SANDBOX_IMAGE`'s default tag is left alone."""
    import docker

    from orchestrator.sandboxes.image.build import BuildSources, ImageBuilder

    engine = docker.from_env()
    try:
        result = ImageBuilder(engine, BuildSources.from_checkout(tree), image="sandbox-orchestrator/bench-compare:latest").build()
    finally:
        engine.close()
    return f"{result.image.rpartition(':')[0]}:{result.recipe[:12]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="main", help="git revision to compare with (default: main)")
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    parser.add_argument(
        "--baseline-python",
        default=sys.executable,
        help="interpreter of the baseline (e.g. a venv without dependencies added since); default: this one",
    )
    parser.add_argument("--calls", type=int, default=2000, help="read_file calls per server")
    parser.add_argument("--sends", type=int, default=40, help="1 MiB send_file calls per server")
    args = parser.parse_args()

    base = bench_dir("compare-")
    os.chmod(base, 0o711)  # sandbox uids must traverse to the data dirs
    baseline_tree = export_revision(args.baseline, base)
    docker = args.backend == "docker"
    servers = [
        Server("baseline", baseline_tree, base / "data-baseline", args.backend, docker_image(baseline_tree) if docker else None, args.baseline_python),
        Server("current", REPO, base / "data-current", args.backend, docker_image(REPO) if docker else None),
    ]
    try:
        for server in servers:
            server.start()
        agents = {s.name: s.agent() for s in servers}
        for _ in range(max(1, args.calls // BLOCK)):
            for server in servers:
                for _ in range(BLOCK):
                    server.timed("read_file_api", lambda: server.call("read_file", path="small.txt"))
                for _ in range(BLOCK // 5):  # the shell's output path (readers, caps, the sweep)
                    server.timed("shell_echo_api", lambda: server.call("shell", command="echo hello"))
                    server.timed("read_bytes_small_api", lambda: server.call("read_bytes", path="small.txt"))
                agent, cwd = agents[server.name], server.run["workdir"]
                for _ in range(BLOCK):
                    server.timed("read_file_agent_direct", lambda: agent.call("read_file", {"path": "small.txt"}, cwd=cwd))
        for client in agents.values():
            client.close()
        for _ in range(args.sends):
            for server in servers:
                server.timed("send_file_1mib_by_path", lambda: server.call("send_file", path_or_url="big.bin"))
                server.timed("read_bytes_1mib_api", lambda: server.call("read_bytes", path="big.bin"))
        if args.backend == "docker":
            for server in servers:
                container, path = server.container(), f"{server.run['workdir']}/small.txt"
                for _ in range(30):
                    server.timed(
                        "docker_exec_cat",
                        lambda: subprocess.run(["docker", "exec", container, "cat", path], check=True, capture_output=True),
                    )
        print(f"baseline_revision: {subprocess.run(['git', '-C', str(REPO), 'rev-parse', '--short', args.baseline], capture_output=True, text=True).stdout.strip()} rev")
        for server in servers:
            for figure, samples in server.samples.items():
                print(f"{server.name}_{figure}_median: {statistics.median(samples):.3f} ms")
                if figure == "read_file_api":
                    print(f"{server.name}_{figure}_p99: {pct(samples, 0.99):.3f} ms")
            api = statistics.median(server.samples["read_file_api"])
            print(f"{server.name}_orchestrator_share_median: {api - statistics.median(server.samples['read_file_agent_direct']):.3f} ms")
            if "docker_exec_cat" in server.samples:
                print(f"{server.name}_docker_exec_over_api_ratio: {statistics.median(server.samples['docker_exec_cat']) / api:.1f} x")
        before, after = (statistics.median(s.samples["read_file_api"]) for s in servers)
        print(f"read_file_api_speedup: {before / after:.2f} x")
        before, after = (statistics.median(s.samples["shell_echo_api"]) for s in servers)
        print(f"shell_echo_api_speedup: {before / after:.2f} x")
        for figure in ("send_file_1mib_by_path", "read_bytes_small_api", "read_bytes_1mib_api"):
            before, after = (statistics.median(s.samples[figure]) for s in servers)
            print(f"{figure}_speedup: {before / after:.2f} x")
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
