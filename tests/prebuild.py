"""`python -m tests.prebuild`: build what the suite's first tests would otherwise build inside the
timed run: the sandbox image (tests/sandbox_image.py, reused when its recipe is unchanged), the
code kernels' venv (tests/kernel_python.py) and the agent frameworks' venvs
(tests/orchestrator/mcp/framework_venv.py), each reused from the build cache when present.
`.ci/run` starts it in the background while the local Kubernetes cluster comes up (which mostly
waits), so the two overlap; the suite finds everything built and reuses it."""

from __future__ import annotations

import time


def main() -> int:
    from tests.kernel_python import kernel_python
    from tests.orchestrator.mcp.framework_venv import FRAMEWORKS, framework_python
    from tests.sandbox_image import ensure_sandbox_image, recipe_tag

    steps = [("sandbox image", lambda: recipe_tag(ensure_sandbox_image())), ("kernel venv", kernel_python)]
    steps += [(f"{name} venv", lambda name=name: str(framework_python(name))) for name in FRAMEWORKS]
    for what, build in steps:
        started = time.monotonic()
        print(f"prebuild: {what}: {build()} ({time.monotonic() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
