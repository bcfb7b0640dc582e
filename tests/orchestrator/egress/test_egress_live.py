"""The egress proxy end to end with real agents of the process backend (as root each in a
network namespace with only `lo` and its forwarder): a sandbox shell reaches a loopback test
upstream only as far as its runtime user's allow list says, refusals are 403s a model can act
on, caps refuse or cut, and every connection leaves an audit row. Only 127.0.0.1 is contacted:
names that must be refused are under `.invalid` (never resolves) or resolve to loopback."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator import audit
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.api_calls import tool
from tests.metrics_text import sample_value, scrape
from tests.conftest import API_TOKEN, TEST_ROOT, admin_headers, make_settings
from tests.orchestrator.egress.dns_server import DnsServer, loopback_dns
from tests.orchestrator.egress.sandbox_client import command
from tests.orchestrator.egress.upstream import HELLO, RequestCounter, counting_upstream, loopback_upstream
from tests.orchestrator.sandboxes.test_process_network import web_run

AS_ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(not AS_ROOT, reason="a sandbox network of its own needs a root orchestrator")

BYTE_CAP = 1024 * 1024
MAX_CONNECTIONS = 16

Served = tuple[TestClient, OrchestratorService]


def uid_slice(index: int) -> dict[str, int]:
    """Two servers of this module live at once: each a slice of the run's uid block."""
    base = int(os.environ.get("ORCH_SANDBOX_UID_BASE", "100000"))
    return {"sandbox_uid_base": base + index * 1000, "max_user_id": 999}


@contextmanager
def served(**overrides: object) -> Iterator[Served]:
    base = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="egress-"))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    service = OrchestratorService(make_settings(data, **overrides))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client, service
    finally:
        service.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    with loopback_upstream() as port:
        yield port


@pytest.fixture(scope="module")
def loopback_allowed() -> Iterator[Served]:
    """A server whose proxy may reach loopback (ORCH_EGRESS_ALLOW_LOOPBACK), with small caps."""
    with served(
        **uid_slice(0),
        egress_allow_loopback=True,
        egress_max_bytes_per_connection=BYTE_CAP,
        egress_max_connections=MAX_CONNECTIONS,
    ) as pair:
        yield pair


@pytest.fixture(scope="module")
def loopback_refused() -> Iterator[Served]:
    with served(**uid_slice(1)) as pair:
        yield pair


def through_proxy(client: TestClient, run_id: str, mode: str, target: str) -> dict:
    answer = tool(client, run_id, "shell", command=command(mode, target), timeout_s=60)
    assert answer["ok"], answer
    assert answer["result"]["exit_code"] == 0, answer
    return json.loads(answer["result"]["stdout"])


def put_rules(client: TestClient, user_id: int, **body: list[str]) -> dict:
    response = client.put(f"/v1/admin/users/{user_id}/egress", json=body, headers=admin_headers())
    assert response.status_code == 200, response.text
    return response.json()


def egress_rows(service: OrchestratorService, user_id: int, host: str) -> list[audit.AuditEntry]:
    assert service.egress is not None
    service.egress.flush_audit()
    rows = audit.entries(service.store, action="egress_connection", limit=1000)
    return [r for r in rows if r.runtime_user_id == user_id and r.detail["host"] == host]


def test_an_admin_allows_a_loopback_upstream_for_67_only_and_removing_it_refuses_the_next(
    loopback_allowed: Served, upstream: int
) -> None:
    client, service = loopback_allowed
    target = f"127.0.0.1:{upstream}"
    run_67, run_17 = web_run(client, 67), web_run(client, 17)
    metrics_before = scrape(client)
    before = through_proxy(client, run_67, "get", f"{target}/hello")
    assert before["status"] == 403, before
    assert f"Egress to {target} is not allowed for runtime identity 67" in before["body"]
    assert "ask an admin to allow it" in before["body"] and "pypi.org" in before["body"]

    rules = put_rules(client, 67, allow=[target])
    assert target in rules["effective"] and "pypi.org" in rules["effective"]
    got = through_proxy(client, run_67, "get", f"{target}/hello")
    assert got["status"] == 200 and got["body"] == HELLO.decode(), got
    tunnel = through_proxy(client, run_67, "connect", f"{target}/hello")
    assert tunnel["status"] == 200 and tunnel["body"] == HELLO.decode(), tunnel
    other = through_proxy(client, run_17, "get", f"{target}/hello")
    assert other["status"] == 403 and "runtime identity 17" in other["body"], other

    put_rules(client, 67, allow=[])
    after = through_proxy(client, run_67, "connect", f"{target}/hello")
    assert after["status"] == 403 and "runtime identity 67" in after["body"], after

    rows_67 = egress_rows(service, 67, "127.0.0.1")
    verdicts = sorted((r.detail["method"], r.detail["verdict"]) for r in rows_67)
    assert verdicts == sorted(
        [("GET", "host_not_allowed"), ("GET", "allowed"), ("CONNECT", "allowed"), ("CONNECT", "host_not_allowed")]
    ), verdicts
    allowed = next(r for r in rows_67 if r.detail["verdict"] == "allowed" and r.detail["method"] == "GET")
    assert allowed.detail["address"] == "127.0.0.1" and allowed.detail["port"] == upstream
    assert allowed.detail["bytes_down"] > len(HELLO) and allowed.detail["bytes_up"] > 0
    assert allowed.detail["run_id"] == run_67 and allowed.session_id is not None
    assert [r.detail["verdict"] for r in egress_rows(service, 17, "127.0.0.1")] == ["host_not_allowed"]

    # /metrics counts the same connections and bytes (other tests of the module may add some).
    moved = scrape(client)
    def grew(name: str, **labels: str) -> float:
        return sample_value(moved, name, **labels) - sample_value(metrics_before, name, **labels)
    assert grew("orchestrator_egress_connections_total", verdict="allowed") >= 2
    assert grew("orchestrator_egress_connections_total", verdict="host_not_allowed") >= 3
    assert grew("orchestrator_egress_bytes_total", direction="down") >= allowed.detail["bytes_down"]


def test_a_name_not_on_the_list_and_a_name_resolving_to_loopback_are_refused(loopback_refused: Served, upstream: int) -> None:
    client, service = loopback_refused
    put_rules(client, 17, allow=[f"localhost:{upstream}"])
    run_id = web_run(client, 17)
    unknown = through_proxy(client, run_id, "connect", "registry.example.invalid:443/")
    assert unknown["status"] == 403, unknown
    assert "Egress to registry.example.invalid:443 is not allowed for runtime identity 17" in unknown["body"]
    local = through_proxy(client, run_id, "get", f"localhost:{upstream}/hello")
    assert local["status"] == 403, local
    assert "resolves to a loopback address" in local["body"], local
    [unknown_row] = egress_rows(service, 17, "registry.example.invalid")
    assert unknown_row.detail["verdict"] == "host_not_allowed" and unknown_row.detail["address"] is None
    [local_row] = egress_rows(service, 17, "localhost")
    assert (local_row.detail["verdict"], local_row.detail["reason"]) == ("address_forbidden", "loopback")


def test_a_connection_past_the_byte_cap_is_cut(loopback_allowed: Served, upstream: int) -> None:
    client, service = loopback_allowed
    put_rules(client, 68, allow=[f"127.0.0.1:{upstream}"])
    run_id = web_run(client, 68)
    small = through_proxy(client, run_id, "get", f"127.0.0.1:{upstream}/big?n={BYTE_CAP // 2}")
    assert small["status"] == 200 and small["length"] == BYTE_CAP // 2, small
    big = through_proxy(client, run_id, "get", f"127.0.0.1:{upstream}/big?n={3 * BYTE_CAP}")
    if big["status"] == 200:  # cut mid-body, not after it
        assert big["length"] < BYTE_CAP, big
    else:  # the first chunk already passed the cap: nothing of the answer was sent, the reason is
        assert big["status"] == 403, big
        assert "passed 1048576 bytes (ORCH_EGRESS_MAX_BYTES_PER_CONNECTION) and was cut" in big["body"], big
    rows = egress_rows(service, 68, "127.0.0.1")
    cut = [r for r in rows if r.detail["verdict"] == "cut"]
    assert len(cut) == 1 and cut[0].detail["reason"] == "connection_bytes_exceeded", [r.detail for r in rows]
    assert cut[0].detail["bytes_down"] + cut[0].detail["bytes_up"] > BYTE_CAP


def test_200_parallel_connects_of_one_sandbox_leave_other_users_served(loopback_allowed: Served, upstream: int) -> None:
    import threading
    import time

    client, service = loopback_allowed
    target = f"127.0.0.1:{upstream}"
    for user_id in (69, 70):
        put_rules(client, user_id, allow=[target])
    run_69, run_70 = web_run(client, 69), web_run(client, 70)
    through_proxy(client, run_70, "get", f"{target}/hello")  # 70's sandbox is up before the flood
    flood: dict = {}

    def run_flood() -> None:
        flood["answer"] = tool(client, run_69, "shell", command=command("flood", target, "4"), timeout_s=60)

    thread = threading.Thread(target=run_flood)
    thread.start()
    assert service.egress is not None
    deadline = time.monotonic() + 30
    while service.egress._caps.get(69) is None or service.egress._caps[69].open_connections < MAX_CONNECTIONS:
        assert time.monotonic() < deadline, "the flood never filled 69's connections"
        time.sleep(0.05)
    started = time.monotonic()
    health = client.get("/healthz")
    health_s = time.monotonic() - started
    started = time.monotonic()
    other = through_proxy(client, run_70, "connect", f"{target}/hello")
    other_s = time.monotonic() - started
    assert service.egress._caps[69].open_connections == MAX_CONNECTIONS  # still held meanwhile
    thread.join(60)
    assert health.status_code == 200 and health_s < 1.0, health_s
    assert other["status"] == 200 and other["body"] == HELLO.decode(), other
    assert other_s < 5.0, other_s
    answer = flood["answer"]
    assert answer["ok"] and answer["result"]["exit_code"] == 0, answer
    result = json.loads(answer["result"]["stdout"])
    assert result["statuses"] == {"200": MAX_CONNECTIONS, "429": 200 - MAX_CONNECTIONS}, result
    assert len(result["bodies"]) == 1 and "egress connections open (at most 16)" in result["bodies"][0], result
    rows = egress_rows(service, 69, "127.0.0.1")
    verdicts = sorted((r.detail["verdict"], r.detail["reason"]) for r in rows)
    assert verdicts.count(("cap", "too_many_connections")) == 200 - MAX_CONNECTIONS
    assert verdicts.count(("allowed", "ok")) == MAX_CONNECTIONS


DIRECT = (
    "python3 -c \"import socket,sys; s=socket.socket(); s.settimeout(3)\n"
    "try:\n s.connect(('127.0.0.1', {port})); print('CONNECTED')\n"
    "except OSError as e:\n print('REFUSED', e)\""
)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
def test_a_bwrap_sandbox_has_only_loopback_and_the_forwarder(upstream: int) -> None:
    with served(**uid_slice(2), process_sandbox="bwrap", egress_allow_loopback=True) as (client, service):
        health = client.get("/healthz", headers=admin_headers()).json()
        assert health["egress"]["enforced"] == {"process": True}, health["egress"]
        put_rules(client, 71, allow=[f"127.0.0.1:{upstream}"])
        run_id = web_run(client, 71)
        got = through_proxy(client, run_id, "get", f"127.0.0.1:{upstream}/hello")
        assert got["status"] == 200 and got["body"] == HELLO.decode(), got
        direct = tool(client, run_id, "shell", command=DIRECT.format(port=upstream))["result"]
        assert "REFUSED" in direct["stdout"], direct  # the host's loopback is not the sandbox's
        interfaces = tool(client, run_id, "shell", command="tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert interfaces["result"]["stdout"].split() == ["lo"], interfaces
        env = tool(client, run_id, "shell", command="echo $HTTPS_PROXY; cat ~/.config/pip/pip.conf ~/.npmrc")
        assert env["result"]["stdout"].startswith("http://127.0.0.1:3128\n"), env
        assert "proxy = http://127.0.0.1:3128" in env["result"]["stdout"]
        assert "https-proxy=http://127.0.0.1:3128" in env["result"]["stdout"]


def test_only_the_users_own_sandbox_uid_is_served_on_its_socket(loopback_allowed: Served, upstream: int) -> None:
    import socket

    client, service = loopback_allowed
    put_rules(client, 72, allow=[f"127.0.0.1:{upstream}"])
    run_id = web_run(client, 72)
    assert through_proxy(client, run_id, "get", f"127.0.0.1:{upstream}/hello")["status"] == 200
    # This test runs as root, which may enter the directory but is not 72's sandbox uid.
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(service.layout.egress_socket_path(72)))
        try:
            sock.sendall(f"GET http://127.0.0.1:{upstream}/hello HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answer = sock.recv(65536)
        except (BrokenPipeError, ConnectionResetError):
            answer = b""
        assert answer == b""  # closed unanswered: nothing was relayed
    rows = egress_rows(service, 72, "")
    assert [(r.detail["verdict"], r.detail["reason"]) for r in rows] == [("peer_refused", "peer_uid_0")], rows


def test_a_socket_the_sandbox_replaced_by_a_link_or_a_directory_is_made_again_without_following(
    loopback_allowed: Served, upstream: int, tmp_path: Path
) -> None:
    import time

    from orchestrator.egress import service as egress_service

    client, service = loopback_allowed
    put_rules(client, 73, allow=[f"127.0.0.1:{upstream}"])
    run_id = web_run(client, 73)
    assert through_proxy(client, run_id, "get", f"127.0.0.1:{upstream}/hello")["status"] == 200
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    os.chmod(tmp_path, 0o755)
    socket_path = service.layout.egress_socket_path(73)
    for plant in (f"ln -s {victim} {socket_path}", f"mkdir {socket_path} && touch {socket_path}/inside"):
        planted = tool(client, run_id, "shell", command=f"rm -rf {socket_path} && {plant} && echo planted")
        assert planted["result"]["stdout"].strip() == "planted", planted
        time.sleep(egress_service.RECHECK_S + 0.2)
        got = through_proxy(client, run_id, "get", f"127.0.0.1:{upstream}/hello")  # this call rebinds
        assert got["status"] == 200 and got["body"] == HELLO.decode(), got
        assert victim.read_text() == "root's file\n" and not victim.is_symlink()
        assert socket_path.is_socket()


HOARD = r"""
import os, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
held, refused = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)  # and never a byte: each would wait for its head timeout
    held.append(s)
time.sleep(4)  # past the cap, a listener closes one each 50 ms (proxy.REFUSED_PAUSE_S)
for s in held:
    s.setblocking(False)
    try:
        if s.recv(1) == b"":
            refused += 1
    except BlockingIOError:
        pass
print(refused)
"""


def test_sockets_that_never_send_a_head_are_capped_per_user(loopback_allowed: Served, upstream: int) -> None:
    import shlex

    from orchestrator.egress import service as egress_service

    client, service = loopback_allowed
    put_rules(client, 74, allow=[f"127.0.0.1:{upstream}"])
    run_id = web_run(client, 74)
    assert through_proxy(client, run_id, "get", f"127.0.0.1:{upstream}/hello")["status"] == 200
    cap = MAX_CONNECTIONS + egress_service.UNADMITTED_EXTRA
    hoard = tool(
        client, run_id, "shell",
        command=f"ulimit -n 4096; python3 -c {shlex.quote(HOARD)} {service.layout.egress_socket_path(74)} {cap + 50}",
    )["result"]  # fmt: skip
    assert hoard["exit_code"] == 0 and int(hoard["stdout"]) == 50, hoard  # the ones past the cap: closed at once
    other = web_run(client, 75)
    put_rules(client, 75, allow=[f"127.0.0.1:{upstream}"])
    assert through_proxy(client, other, "get", f"127.0.0.1:{upstream}/hello")["status"] == 200


GARBAGE = r"""
import os, socket, sys
host, port = os.environ["HTTP_PROXY"].split("//")[1].rsplit(":", 1)
answered = 0
for _ in range(int(sys.argv[1])):
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"NOT HTTP\r\n\r\n")
    answered += s.recv(16).startswith(b"HTTP/1.1 400")
    s.close()
print(answered)
"""


def test_a_flood_of_refused_connections_cannot_flood_the_audit(loopback_allowed: Served, upstream: int) -> None:
    # Each connection is one audit row: a sandbox opening refused ones as fast as it can grew
    # the host's state database (on no quota) and kept its one writer busy for everyone.
    import shlex

    from orchestrator.egress.audit_budget import ROWS_PER_WINDOW

    client, service = loopback_allowed
    run_id = web_run(client, 76)
    flood = tool(client, run_id, "shell", command=f"python3 -c {shlex.quote(GARBAGE)} {ROWS_PER_WINDOW + 400}", timeout_s=60)["result"]
    assert flood["exit_code"] == 0 and int(flood["stdout"]) == ROWS_PER_WINDOW + 400, flood  # each still answered
    assert service.egress is not None
    service.egress.flush_audit(10)
    rows = [r for r in audit.entries(service.store, action="egress_connection", limit=5000) if r.runtime_user_id == 76]
    assert len(rows) <= ROWS_PER_WINDOW, len(rows)
    # Another user's connection is still written.
    put_rules(client, 77, allow=[f"127.0.0.1:{upstream}"])
    assert through_proxy(client, web_run(client, 77), "get", f"127.0.0.1:{upstream}/hello")["status"] == 200
    assert egress_rows(service, 77, "127.0.0.1")


def raw_request(client: TestClient, run_id: str, data: bytes) -> dict:
    import base64

    return through_proxy(client, run_id, "raw", base64.b64encode(data).decode())


@contextmanager
def counting_target(client: TestClient, user_id: int) -> Iterator[tuple[str, RequestCounter, str]]:
    """A request-counting upstream on loopback that `user_id` may reach: (its host:port, what
    it counted, a run of the user's)."""
    with counting_upstream() as (port, counter):
        target = f"127.0.0.1:{port}"
        put_rules(client, user_id, allow=[target])
        yield target, counter, web_run(client, user_id)


def test_a_pipelined_second_request_never_reaches_the_upstream(loopback_allowed: Served) -> None:
    # One request per connection: a second request pipelined behind the first (here with a
    # forged Host, which a virtual-hosting upstream would route elsewhere) reached the upstream.
    import time

    client, service = loopback_allowed
    with counting_target(client, 78) as (target, counter, run_id):
        pipelined = (
            f"GET http://{target}/first HTTP/1.1\r\nHost: {target}\r\n\r\n"
            f"GET /second HTTP/1.1\r\nHost: metadata.internal.example\r\n\r\n"
        ).encode()
        got = raw_request(client, run_id, pipelined)
        assert got["status"] == 200 and got["body"] == HELLO.decode(), got
        time.sleep(1.0)  # the upstream counts when its connection ends
        assert counter.requests == [("GET /first HTTP/1.1", target)], counter.requests
    [row] = egress_rows(service, 78, "127.0.0.1")
    assert (row.detail["verdict"], row.detail["port"]) == ("allowed", int(target.rsplit(":", 1)[1]))


def test_a_host_header_naming_another_host_is_refused(loopback_allowed: Served) -> None:
    import time

    client, service = loopback_allowed
    with counting_target(client, 79) as (target, counter, run_id):
        port = int(target.rsplit(":", 1)[1])
        forged = raw_request(client, run_id, f"GET http://{target}/x HTTP/1.1\r\nHost: pypi.org\r\n\r\n".encode())
        assert forged["status"] == 400, forged
        assert "X-Egress-Refusal: host_mismatch" in forged["head"], forged
        assert f"the Host header (pypi.org) does not name the request's target ({target})" in forged["body"], forged
        two = raw_request(client, run_id, f"GET http://{target}/x HTTP/1.1\r\nHost: {target}\r\nHost: {target}\r\n\r\n".encode())
        assert two["status"] == 400 and "X-Egress-Refusal: host_mismatch" in two["head"], two
        # The same host in another spelling, and an HTTP/1.0 request without one, are served.
        spelled = raw_request(client, run_id, f"GET http://{target}/x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        assert spelled["status"] == 200, spelled
        bare = raw_request(client, run_id, f"GET http://{target}/x HTTP/1.0\r\n\r\n".encode())
        assert bare["status"] == 200, bare
        time.sleep(1.0)
        assert [host for _line, host in counter.requests] == [target, target], counter.requests
    rows = egress_rows(service, 79, "127.0.0.1")
    verdicts = sorted((r.detail["verdict"], r.detail["reason"]) for r in rows)
    assert verdicts == [("allowed", "ok"), ("allowed", "ok"), ("bad_request", "host_mismatch"), ("bad_request", "host_mismatch")], verdicts


def test_a_host_smuggled_behind_a_bare_line_feed_never_reaches_the_upstream(loopback_allowed: Served, upstream: int) -> None:
    # The proxy splits the head at CRLF; many upstreams also end a line at a bare LF. A Host
    # (or Transfer-Encoding) hidden behind one, in a header or in the request target, was
    # forwarded unseen, and a virtual-hosting upstream routed by it.
    client, _service = loopback_allowed
    target = f"127.0.0.1:{upstream}"
    put_rules(client, 81, allow=[target])
    run_id = web_run(client, 81)
    in_header = raw_request(client, run_id, f"GET http://{target}/host HTTP/1.1\r\nX-Pad: a\nHost: metadata.internal.example\r\n\r\n".encode())
    assert in_header["status"] == 400 and "X-Egress-Refusal: bad_header" in in_header["head"], in_header
    folded = raw_request(client, run_id, f"GET http://{target}/host HTTP/1.1\r\nX-Pad: a\r\n Host: metadata.internal.example\r\n\r\n".encode())
    assert folded["status"] == 400 and "X-Egress-Refusal: bad_header" in folded["head"], folded
    in_target = raw_request(client, run_id, f"GET http://{target}/host\nHost:metadata.internal.example\nX: HTTP/1.1\r\n\r\n".encode())
    assert in_target["status"] == 400 and "X-Egress-Refusal: bad_target" in in_target["head"], in_target
    in_version = raw_request(client, run_id, f"GET http://{target}/host HTTP/1.1\nHost:metadata.internal.example\r\n\r\n".encode())
    assert in_version["status"] == 400 and "X-Egress-Refusal: bad_target" in in_version["head"], in_version
    honest = raw_request(client, run_id, f"GET http://{target}/host HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    assert honest["status"] == 200 and honest["body"] == target, honest


DNS_TIMEOUT_S = 3.0
LOOKUPS_PER_USER = 8


@pytest.fixture(scope="module")
def slow_dns() -> Iterator[DnsServer]:
    """Our DNS server on loopback: `fast.example.test` answers 127.0.0.1 at once, `slow-*`
    names never answer (a slowly resolving name under an allowed wildcard)."""
    with loopback_dns({"fast.example.test": "127.0.0.1"}, lambda name: name.startswith("slow-"), None) as dns:
        yield dns


@pytest.fixture(scope="module")
def resolving_via_loopback_dns(slow_dns: DnsServer) -> Iterator[Served]:
    with served(
        **uid_slice(3),
        egress_allow_loopback=True,
        egress_dns_servers=f"127.0.0.1:{slow_dns.port}",
        egress_dns_timeout_s=DNS_TIMEOUT_S,
        egress_dns_lookups_per_user=LOOKUPS_PER_USER,
        egress_dns_lookups=3 * LOOKUPS_PER_USER,
    ) as pair:
        yield pair


def test_one_users_slow_lookups_never_delay_another_users_connect(
    resolving_via_loopback_dns: Served, slow_dns: DnsServer, upstream: int
) -> None:
    # 64 CONNECTs to slowly resolving names under *.pythonhosted.org (a default pattern) held
    # the lookup threads everyone shared: another user's pypi.org failed with reason=dns.
    import threading
    import time

    client, service = resolving_via_loopback_dns
    assert service.egress is not None
    fast = f"fast.example.test:{upstream}"
    for user_id in (80, 81):
        put_rules(client, user_id, allow=[fast])
    run_a, run_b = web_run(client, 80), web_run(client, 81)
    assert through_proxy(client, run_b, "connect", f"{fast}/hello")["status"] == 200  # B's sandbox is up
    flood: dict = {}

    def run_flood() -> None:
        flood["answer"] = tool(
            client, run_a, "shell", command=command("flood", "slow-{}.pythonhosted.org:443", "0", "64"), timeout_s=60
        )

    thread = threading.Thread(target=run_flood)
    thread.start()
    deadline = time.monotonic() + 30
    while service.egress.lookups.in_flight.get(80, 0) < LOOKUPS_PER_USER:
        assert time.monotonic() < deadline, "the flood never filled 80's lookups"
        time.sleep(0.02)
    started = time.monotonic()
    other = through_proxy(client, run_b, "connect", f"{fast}/hello")
    other_s = time.monotonic() - started
    assert service.egress.lookups.in_flight.get(80) == LOOKUPS_PER_USER  # still held meanwhile
    thread.join(60)
    assert other["status"] == 200 and other["body"] == HELLO.decode(), other
    assert other_s < 1.5, other_s  # a shell call's round trip, not a lookup timeout

    answer = flood["answer"]
    assert answer["ok"] and answer["result"]["exit_code"] == 0, answer
    result = json.loads(answer["result"]["stdout"])
    assert result["statuses"] == {"429": 64 - LOOKUPS_PER_USER, "502": LOOKUPS_PER_USER}, result
    assert any(f"name lookups in flight (at most {LOOKUPS_PER_USER}, ORCH_EGRESS_DNS_LOOKUPS_PER_USER)" in b for b in result["bodies"]), result
    assert any(f"did not resolve within {DNS_TIMEOUT_S:g} s" in b for b in result["bodies"]), result
    assert DNS_TIMEOUT_S - 0.5 < result["slowest_s"]["502"] < DNS_TIMEOUT_S + 2, result

    # The timed-out lookups gave their slots back: A resolves again at once.
    assert service.egress.lookups.in_flight == {} and service.egress.lookups.in_flight_total == 0
    started = time.monotonic()
    again = through_proxy(client, run_a, "connect", f"{fast}/hello")
    assert again["status"] == 200 and time.monotonic() - started < 1.5, again
    assert sum(n for name, n in slow_dns.questions.items() if name.startswith("slow-")) <= 2 * LOOKUPS_PER_USER

    service.egress.flush_audit()
    rows = [r for r in audit.entries(service.store, action="egress_connection", limit=1000) if r.runtime_user_id == 80]
    verdicts = sorted((r.detail["verdict"], r.detail["reason"]) for r in rows if r.detail["host"].startswith("slow-"))
    assert verdicts.count(("cap", "dns_lookups_per_user")) == 64 - LOOKUPS_PER_USER, verdicts
    assert verdicts.count(("upstream_failed", "dns")) == LOOKUPS_PER_USER, verdicts
