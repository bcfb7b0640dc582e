"""`python -m tests.prebuild [--node-engine URL]`: build what the suite's first tests would
otherwise build inside the timed run: the sandbox image (tests/sandbox_image.py, reused when its
recipe is unchanged), with `--node-engine` also loaded into the local cluster's node engine (as
the `k8s_image` fixture does; waited for while the cluster starts it), the code kernels' venv
(tests/kernel_python.py) and the agent frameworks' venvs (tests/orchestrator/mcp/framework_venv.py),
each reused from the build cache when present. `.ci/run` starts it in the background while the
local Kubernetes cluster comes up (which mostly waits), so the two overlap; the suite finds
everything in place and reuses it (the same code checks the same keys)."""

from __future__ import annotations

import argparse
import subprocess
import time

ENGINE_WAIT_S = 120.0  # `up` starts the node's engine first, within a second or two


def wait_for_engine(engine: str) -> str:
    deadline = time.monotonic() + ENGINE_WAIT_S
    while subprocess.run(["docker", "-H", engine, "info"], capture_output=True, timeout=30).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no Docker engine answered on {engine} within {ENGINE_WAIT_S:.0f} s")
        time.sleep(0.5)
    return engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.prebuild")
    parser.add_argument("--node-engine", help="also load the sandbox image into this engine (unix://...)")
    args = parser.parse_args(argv)

    from tests.kernel_python import kernel_python
    from tests.kube_cluster import load_image_into_node
    from tests.orchestrator.mcp.framework_venv import FRAMEWORKS, framework_python
    from tests.sandbox_image import ensure_sandbox_image, recipe_tag

    image = recipe_tag(ensure_sandbox_image())
    print(f"prebuild: sandbox image {image}", flush=True)
    steps = []
    if args.node_engine:
        steps.append(("image in the node engine", lambda: load_image_into_node(image, wait_for_engine(args.node_engine))))
    steps.append(("kernel venv", kernel_python))
    steps += [(f"{name} venv", lambda name=name: str(framework_python(name))) for name in FRAMEWORKS]
    failed = 0
    for what, build in steps:  # one failing step stops none of the others
        started = time.monotonic()
        try:
            print(f"prebuild: {what}: {build() or 'done'} ({time.monotonic() - started:.1f} s)", flush=True)
        except BaseException as exc:  # noqa: BLE001 - pytest.skip (a Skipped) included: reported, the suite retries
            failed += 1
            print(f"prebuild: {what} FAILED: {type(exc).__name__}: {exc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
