"""Skills through the API (docs/skills.md): what a PUT costs, how soon a run sees a change made
through the API vs one written into the data dir (seen by the file watcher), and how many runs
started *during* changes find the skill missing or failed either way.

usage: .venv/bin/python bench/skill_install.py [--files 25] [--kib 512] [--rounds 9]
Prints `name: value unit` lines. A real server (uvicorn on a loopback port, watchers running)
on a fresh data dir under bench.measure.BENCH_ROOT; the two ways of changing a skill alternate in one run so they
share the machine's noise. "Visible" means: a run started in a session links a view whose
SKILL.md has the new version. Meanwhile a second client starts runs in its own session
without pause and counts those that lack a skill that exists before and after every change.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import bench_root  # noqa: E402
from orchestrator.client import OrchestratorClient, SkillFile  # noqa: E402
from orchestrator.http.app import create_app  # noqa: E402
from orchestrator.service import OrchestratorService  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402
from tests.live_server import free_port, live_server  # noqa: E402

TIMEOUT_S = 30.0


def skill_files(version: int, files: int, total_bytes: int, rng: random.Random) -> dict[str, SkillFile]:
    out = {"SKILL.md": SkillFile(content=f"# bench\nversion {version}\n")}
    size = max(1, total_bytes // files)
    for i in range(files - 1):
        folder = "scripts" if i % 2 else "references"
        out[f"{folder}/part-{i:03}.bin"] = SkillFile(content=rng.randbytes(size), executable=folder == "scripts")
    return out


def write_into(directory: Path, files: dict[str, SkillFile]) -> None:
    """What an admin with shell access does: replace the directory's files in place."""
    shutil.rmtree(directory, ignore_errors=True)
    for rel, file in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = file.content if isinstance(file.content, bytes) else file.content.encode()
        path.write_bytes(data)
        os.chmod(path, 0o755 if file.executable else 0o644)


def wait_visible(client: OrchestratorClient, sid: str, name: str, version: int) -> int:
    """Runs started until one links `name` with the wanted version; how many it took."""
    deadline = time.monotonic() + TIMEOUT_S
    runs = 0
    while True:
        run = client.start_run(sid, trigger="web")
        client.end_run(run.run_id)
        runs += 1
        entry = next((e for e in run.skills.catalog if e.name == name), None)
        if entry is not None:
            try:
                if f"version {version}\n" in Path(entry.path, "SKILL.md").read_text():
                    return runs
            except FileNotFoundError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} version {version} not visible after {TIMEOUT_S} s")
        time.sleep(0.005)


class RunPoller(threading.Thread):
    """Starts runs back to back and counts, per skill, the runs that did not have it."""

    def __init__(self, url: str, names: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.client = OrchestratorClient(url)
        self.names = names
        self.stop = threading.Event()
        self.runs = 0
        self.missing = {name: 0 for name in names}

    def run(self) -> None:
        sid = self.client.create_session(owner_user_id=8, channel="web").session_id
        while not self.stop.is_set():
            run = self.client.start_run(sid, trigger="web")
            self.client.end_run(run.run_id)
            self.runs += 1
            for name in self.names:
                if name not in run.skills.available:
                    self.missing[name] += 1
        self.client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=25)
    parser.add_argument("--kib", type=int, default=512, help="total size of the skill")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    rng = random.Random(5)
    base = Path(tempfile.mkdtemp(prefix="skill-install-", dir=bench_root()))
    port = free_port()
    settings = Settings(data_dir=base / "data", backend="process", public_base_url=f"http://127.0.0.1:{port}")
    service = OrchestratorService(settings)
    put_ms, noop_ms, api_visible_ms, api_runs = [], [], [], []
    write_ms, file_visible_ms, file_runs = [], [], []
    try:
        with live_server(create_app(service), port) as url, OrchestratorClient(url) as client:
            sid = client.create_session(owner_user_id=7, channel="web").session_id
            first = skill_files(0, args.files, args.kib * 1024, rng)
            client.put_skill("api-skill", first)
            write_into(settings.layout.skill_source("file-skill"), first)
            wait_visible(client, sid, "file-skill", 0)
            poller = RunPoller(url, ("api-skill", "file-skill"))
            poller.start()
            version = 0
            for _ in range(args.rounds):
                version += 1
                files = skill_files(version, args.files, args.kib * 1024, rng)
                start = time.perf_counter()
                client.put_skill("api-skill", files)
                put_ms.append((time.perf_counter() - start) * 1000)
                api_runs.append(wait_visible(client, sid, "api-skill", version))
                api_visible_ms.append((time.perf_counter() - start) * 1000)
                start = time.perf_counter()
                client.put_skill("api-skill", files)
                noop_ms.append((time.perf_counter() - start) * 1000)

                start = time.perf_counter()
                write_into(settings.layout.skill_source("file-skill"), files)
                write_ms.append((time.perf_counter() - start) * 1000)
                file_runs.append(wait_visible(client, sid, "file-skill", version))
                file_visible_ms.append((time.perf_counter() - start) * 1000)
            poller.stop.set()
            poller.join()
    finally:
        service.close()
        shutil.rmtree(base, ignore_errors=True)
    print(f"skill_files: {args.files} files")
    print(f"skill_size: {args.kib} KiB")
    print(f"put_skill_median: {statistics.median(put_ms):.1f} ms")
    print(f"put_skill_unchanged_median: {statistics.median(noop_ms):.1f} ms")
    print(f"visible_after_put_median: {statistics.median(api_visible_ms):.1f} ms")
    print(f"runs_until_visible_after_put_median: {statistics.median(api_runs):.0f} runs")
    print(f"file_write_median: {statistics.median(write_ms):.1f} ms")
    print(f"visible_after_file_write_median: {statistics.median(file_visible_ms):.1f} ms")
    print(f"runs_until_visible_after_file_write_median: {statistics.median(file_runs):.0f} runs")
    print(f"runs_started_during_changes: {poller.runs} runs")
    print(f"runs_without_the_skill_put_through_the_api: {poller.missing['api-skill']} runs")
    print(f"runs_without_the_skill_rewritten_in_the_data_dir: {poller.missing['file-skill']} runs")


if __name__ == "__main__":
    main()
