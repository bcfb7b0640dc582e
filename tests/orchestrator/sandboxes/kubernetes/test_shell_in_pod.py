"""A shell call in a pod: the pod's pause process (PID 1 of the shared process namespace, the
pod's uid) is not taken for a leftover of the call. It was, and a SIGKILL from inside to PID 1
is ignored: the sweep spun through all its rounds, 10 s added to every shell call."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api_calls import group_session, start_run, tool

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def test_a_shell_call_in_a_pod_is_quick_and_still_stops_what_it_left_running(k8s_client: TestClient) -> None:
    run = start_run(k8s_client, group_session(k8s_client), trigger="web")
    assert tool(k8s_client, run["run_id"], "write_file", path="warm.txt", content="x")["ok"]  # the pod is up
    quick = tool(k8s_client, run["run_id"], "shell", command="echo hi")
    assert quick["ok"] and quick["result"]["stdout"] == "hi\n", quick
    assert quick["result"]["duration_s"] < 3, quick
    assert "note" not in quick["result"], quick  # nothing was left running, and nothing is said to be
    left = tool(k8s_client, run["run_id"], "shell", command="sleep 60 & echo started")
    assert left["ok"] and left["result"]["duration_s"] < 3, left
    assert "1 background process" in left["result"]["note"], left
    scan = 'for f in /proc/[0-9]*/comm; do [ "$(cat $f 2>/dev/null)" = sleep ] && echo found; done; echo end'
    gone = tool(k8s_client, run["run_id"], "shell", command=scan)
    assert gone["result"]["stdout"] == "end\n", gone
