"""The containers' seccomp profile: io_uring (a large kernel attack surface reachable without
any capability; this engine's default profile allows it) is denied, and so are the namespace
and kernel-facility calls the engine's default denies. Through the API, from a sandbox shell."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api_calls import group_session, start_run, tool

pytestmark = pytest.mark.docker

# x86_64 and aarch64 share these numbers (the generic syscall table).
PROBE = """python3 - <<'PY'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
for name, number, args in (("io_uring_setup", 425, (1, params)), ("io_uring_enter", 426, (0, 0, 0, 0, None, 0)),
                           ("io_uring_register", 427, (0, 0, None, 0))):
    result = libc.syscall(number, *args)
    print(name, "ALLOWED" if result >= 0 else os.strerror(ctypes.get_errno()))
print("unshare", "ALLOWED" if libc.unshare(0x10000000) == 0 else os.strerror(ctypes.get_errno()))
PY"""


def test_item_seccomp_io_uring_is_denied_in_a_container(docker_client: TestClient) -> None:
    run = start_run(docker_client, group_session(docker_client), trigger="web")
    answer = tool(docker_client, run["run_id"], "shell", command=PROBE)
    assert answer["ok"], answer
    lines = dict(line.split(" ", 1) for line in answer["result"]["stdout"].splitlines())
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        assert lines[name] in ("Operation not permitted", "Function not implemented"), lines
    assert lines["unshare"] == "Operation not permitted", lines  # no user namespaces either
