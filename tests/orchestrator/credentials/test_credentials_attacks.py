"""A hostile sandbox against credential injection: from the sandbox's own shell it opens a
CONNECT to its credential's host, speaks TLS verified against its own bundle (the deployment
CA), and sends whatever request bytes it likes; the answer must never hold the secret.

The upstream here is what many real servers are: it never echoes a request's headers on
ordinary methods, but answers TRACE the way RFC 9110 describes it (and Apache httpd does by
default): with the request it received as the body."""

from __future__ import annotations

import base64
import json
import os
import shlex
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

import pytest

from orchestrator import audit

from orchestrator.credentials.ca import key_pem, make_ca, mint_host, pem
from orchestrator.credentials.probe import UPSTREAM_CA_NAME, echo_upstream
from tests.orchestrator.egress.dns_server import DnsServer, loopback_dns
from tests.api_calls import tool
from tests.conftest import admin_headers
from tests.orchestrator.credentials.test_credentials_live import MEMBER, OWNER, SECRET, THIRD, World, put_credential, world
from tests.orchestrator.sandboxes.test_process_network import web_run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox network of its own needs a root orchestrator")


class _Traced(BaseHTTPRequestHandler):
    """GET: 200 "ok" (the Authorization seen is kept for the test, never sent back); TRACE:
    the request head as received, as `message/http`."""

    protocol_version = "HTTP/1.1"
    seen: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self.seen.append(self.headers.get("Authorization", ""))
        if self.path.startswith("/stream"):  # an answer that goes on: a line, then another after 10 s
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"first line\n")
            self.wfile.flush()
            time.sleep(10)
            self.wfile.write(b"late line\n")
            self.close_connection = True
            return
        self._answer(b"ok\n", "text/plain")

    def do_TRACE(self) -> None:  # noqa: N802
        self._answer((self.requestline + "\r\n" + self.headers.as_string()).encode(), "message/http")

    do_TRACK = do_TRACE  # IIS's old twin of TRACE


# What every in-sandbox script below starts with: `connect(authority)` sends a CONNECT to the
# in-sandbox forwarder (HTTPS_PROXY) and returns the socket and the proxy's answer head.
CONNECT_PRELUDE = r"""
import os, socket
proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)

def connect(authority):
    s = socket.create_connection((proxy[0].split("//")[1], int(proxy[1])), timeout=30)
    s.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    return s, head
"""


# In the sandbox: CONNECT, TLS verified against the sandbox's bundle, the request bytes as
# given (base64), then everything the connection answers, printed as JSON.
RAW_TLS_SCRIPT = CONNECT_PRELUDE + r"""
import base64, json, ssl, sys
authority, request = sys.argv[1], base64.b64decode(sys.argv[2])
s, head = connect(authority)
if b" 200 " not in head.split(b"\r\n")[0]:
    print(json.dumps({"connect": head.decode(errors="replace")}))
    sys.exit(0)
context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
sni = sys.argv[3] if len(sys.argv) > 3 else authority.rsplit(":", 1)[0]
if sni != authority.rsplit(":", 1)[0]:  # another name, or none ("-"): what certificate comes back is looked at
    context.check_hostname = False
t = context.wrap_socket(s, server_hostname=None if sni == "-" else sni)
names = [v for k, v in t.getpeercert().get("subjectAltName", ())]
t.sendall(request)
data = b""
while True:
    try:
        chunk = t.recv(1 << 16)
    except (OSError, ssl.SSLError):
        break
    if not chunk:
        break
    data += chunk
print(json.dumps({"connect": 200, "answer": data.decode(errors="replace"), "names": names}))
"""


def raw_tls(w: World, run_id: str, authority: str, request: bytes, sni: str | None = None) -> dict:
    """`sni`: the name the sandbox's TLS asks for instead of the CONNECT's host ("-": none)."""
    command = " ".join(["python3", "-c", shlex.quote(RAW_TLS_SCRIPT), shlex.quote(authority),
                        shlex.quote(base64.b64encode(request).decode()), *([shlex.quote(sni)] if sni else [])])  # fmt: skip
    answer = tool(w.client, run_id, "shell", command=command, timeout_s=60)
    assert answer["ok"] and answer["result"]["exit_code"] == 0, answer
    return json.loads(answer["result"]["stdout"])


SLOW_NAME = "slow-api.example.test"  # our loopback DNS answers it (127.0.0.1) after SLOW_S
SLOW_S = 2.0


@dataclass
class Traced:
    w: World
    port: int  # the tracing upstream on 127.0.0.1
    named_port: int  # the same kind of upstream, with a certificate for SLOW_NAME
    dns: DnsServer


@pytest.fixture(scope="module")
def traced() -> Iterator[Traced]:
    with loopback_dns({}, lambda name: name == SLOW_NAME, SLOW_S) as dns, world(
        egress_dns_servers=f"127.0.0.1:{dns.port}", egress_dns_timeout_s=10
    ) as w:  # fmt: skip
        ca_key, ca_cert = make_ca(UPSTREAM_CA_NAME)
        w.upstream_ca.write_bytes(pem(ca_cert))  # the proxy re-reads its upstream bundle
        chains = [key_pem(k) + pem(c) for k, c in (mint_host(ca_key, ca_cert, h) for h in ("127.0.0.1", SLOW_NAME))]
        with echo_upstream(chains[0], _Traced) as port, echo_upstream(chains[1], _Traced) as named_port:
            allow = [f"127.0.0.1:{port}", f"{SLOW_NAME}:{named_port}"]
            for user in (OWNER, MEMBER, THIRD):
                r = w.client.put(f"/v1/admin/users/{user}/egress", json={"allow": allow}, headers=admin_headers())
                assert r.status_code == 200, r.text
            yield Traced(w, port, named_port, dns)


def test_trace_to_a_credentials_host_never_reflects_the_injected_header(traced: Traced) -> None:
    w, port = traced.w, traced.port
    put_credential(w, MEMBER, "traced", [f"127.0.0.1:{port}"])
    run_67 = web_run(w.client, MEMBER)
    authority = f"127.0.0.1:{port}"
    _Traced.seen.clear()
    ordinary = raw_tls(w, run_67, authority, f"GET / HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    assert " 200 " in ordinary["answer"].split("\r\n")[0] and SECRET not in ordinary["answer"], ordinary
    assert _Traced.seen == [f"Bearer {SECRET}"]  # injection works for what the credential is for
    traced_answer = raw_tls(w, run_67, authority, f"TRACE / HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    assert SECRET not in json.dumps(traced_answer), traced_answer
    assert "405" in traced_answer["answer"].split("\r\n")[0] and "TRACE" in traced_answer["answer"], traced_answer


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        # a second request pipelined behind the first: never forwarded
        (b"GET / HTTP/1.1\r\nHost: {a}\r\n\r\nTRACE / HTTP/1.1\r\nHost: {a}\r\n\r\n", 200),
        (b"trace / HTTP/1.1\r\nHost: {a}\r\n\r\n", 405),  # the method in lower case
        (b"TRACK / HTTP/1.1\r\nHost: {a}\r\n\r\n", 405),
        (b"GET / HTTP/1.1\r\nHost: 127.0.0.2:{p}\r\n\r\n", 400),  # a Host naming another host
        (b"GET https://127.0.0.2:{p}/ HTTP/1.1\r\nHost: {a}\r\n\r\n", 400),  # absolute form
        (b"GET / HTTP/1.1\r\nHost: {a}\r\nX: y\nTRACE / HTTP/1.1\r\n\r\n", 400),  # a bare LF
        (b"GET / HTTP/1.1\nHost: {a}\r\n\r\n", 400),  # a bare LF ending the request line
        (b"GET /\x00 HTTP/1.1\r\nHost: {a}\r\n\r\n", 400),  # a control character in the target
        (b"GET / HTTP/1.1\r\nHost: {a}\r\nX: y\r\n Host: 127.0.0.2\r\n\r\n", 400),  # a folded line
        (b"POST / HTTP/1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\nHost: {a}\r\nContent-Length: 0\r\nContent-Length: 60\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),  # HTTP/2 with prior knowledge
        (b"GET / HTTP/1.1\r\nHost: {a}\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
    ],
)
def test_smuggling_shapes_never_bring_the_secret_back(traced: Traced, request_bytes: bytes, status: int) -> None:
    """Held before this branch's fixes too, except TRACE (above) and TRACK."""
    w, port = traced.w, traced.port
    put_credential(w, MEMBER, "traced", [f"127.0.0.1:{port}"])
    authority = f"127.0.0.1:{port}"
    request = request_bytes.replace(b"{a}", authority.encode()).replace(b"{p}", str(port).encode())
    got = raw_tls(w, web_run(w.client, MEMBER), authority, request)
    assert SECRET not in json.dumps(got), got
    assert f" {status} " in got["answer"].split("\r\n")[0], got
    assert got["answer"].count("HTTP/1.1 ") == 1, got  # one answer: nothing after the first request went up


def test_a_credential_replaced_while_a_connection_resolves_never_reaches_the_old_host(traced: Traced) -> None:
    """The sandbox keeps a connection to the credential's host pending (its name resolves
    slowly) while the owner moves the credential's name to another host with another
    secret: that secret must not go to the old host (it did: the proxy rendered the
    credential's current value, whatever hosts it was now for)."""
    import time

    w = traced.w
    put_credential(w, MEMBER, "moving", [f"{SLOW_NAME}:{traced.named_port}"])
    run_67 = web_run(w.client, MEMBER)
    authority = f"{SLOW_NAME}:{traced.named_port}"
    _Traced.seen.clear()
    asked = traced.dns.questions[SLOW_NAME]
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.update(raw_tls(w, run_67, authority, f"GET / HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()))
    )
    thread.start()
    deadline = time.monotonic() + 30
    while traced.dns.questions[SLOW_NAME] == asked:
        assert time.monotonic() < deadline, "the sandbox's CONNECT never looked the name up"
        time.sleep(0.02)
    other_secret = "other_SECRET_for_another_host_987"
    body = {"secret": other_secret, "hosts": [f"127.0.0.1:{traced.port}"], "header": "Authorization", "template": "Bearer {secret}"}
    started = time.monotonic()
    r = w.client.put(f"/v1/users/{MEMBER}/credentials/moving", json=body, headers={"X-Acting-User": str(MEMBER)})
    assert r.status_code == 200, r.text
    assert time.monotonic() - started < SLOW_S / 2  # the replacement came while the name resolved
    thread.join(60)
    assert all(other_secret not in seen for seen in _Traced.seen), _Traced.seen
    assert " 403 " in result["answer"].split("\r\n")[0] and "credential_revoked" in result["answer"], result


# In the sandbox: N CONNECTs one after the other, each closed after the proxy's answer (no
# TLS at all: the proxy mints the host's certificate before the client's hello).
CONNECTS_SCRIPT = CONNECT_PRELUDE + r"""
import collections, json, sys
statuses, bodies = collections.Counter(), set()
for i in range(int(sys.argv[2])):
    s, head = connect(sys.argv[1].format(i))
    status = int(head.split(b" ")[1]) if head else 0
    statuses[status] += 1
    if status != 200:
        bodies.add(s.recv(4096).decode(errors="replace").strip())
    s.close()
print(json.dumps({"statuses": statuses, "bodies": sorted(bodies)}))
"""


def test_new_names_under_a_wildcard_credential_mint_a_bounded_number_of_certificates(traced: Traced) -> None:
    """Every new name under `*.domain` made the proxy mint a host certificate on its loop
    (a key, a signature, a file: about 2 ms each, shared by every user, and each one pushing
    another user's host out of the cache): a sandbox with a wildcard credential could mint
    without bound. Now each user has a bucket of them."""
    from orchestrator.credentials.injection import HOST_MINTS_BURST, HOST_MINTS_PER_S

    w = traced.w
    names = 3 * HOST_MINTS_BURST
    for i in range(names):
        traced.dns.fast[f"x{i}.wild.example.test"] = "127.0.0.1"
    pattern = f"*.wild.example.test:{traced.port}"
    for user in (OWNER, MEMBER, THIRD):
        allow = [f"127.0.0.1:{traced.port}", f"{SLOW_NAME}:{traced.named_port}", pattern]
        r = w.client.put(f"/v1/admin/users/{user}/egress", json={"allow": allow}, headers=admin_headers())
        assert r.status_code == 200, r.text
    put_credential(w, MEMBER, "wild", [pattern])
    put_credential(w, OWNER, "mine", [f"127.0.0.1:{traced.port}"])
    run_67, run_17 = web_run(w.client, MEMBER), web_run(w.client, OWNER)
    ca = w.service.credential_ca
    assert ca is not None
    before, started = ca.minted, time.monotonic()
    command = " ".join(["python3", "-c", shlex.quote(CONNECTS_SCRIPT), shlex.quote(f"x{{}}.wild.example.test:{traced.port}"), str(names)])
    answer = tool(w.client, run_67, "shell", command=command, timeout_s=120)
    assert answer["ok"] and answer["result"]["exit_code"] == 0, answer
    got = json.loads(answer["result"]["stdout"])
    minted, refilled = ca.minted - before, int((time.monotonic() - started) * HOST_MINTS_PER_S) + 1
    assert minted <= HOST_MINTS_BURST + refilled, (minted, refilled, got)  # the burst, and what refilled meanwhile
    assert got["statuses"].get("429", 0) >= names - HOST_MINTS_BURST - refilled, got
    assert any("new host certificates" in b for b in got["bodies"]), got
    # Another user is served meanwhile, and 67's names already minted still work.
    authority = f"127.0.0.1:{traced.port}"
    theirs = raw_tls(w, run_17, authority, f"GET / HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    assert " 200 " in theirs["answer"].split("\r\n")[0], theirs
    again = raw_tls(w, run_67, f"x0.wild.example.test:{traced.port}",
                    f"GET / HTTP/1.1\r\nHost: x0.wild.example.test:{traced.port}\r\n\r\n".encode())  # fmt: skip
    # Intercepted, not refused: the sandbox's TLS took the cached certificate (the 502 is this
    # upstream's own certificate, made for 127.0.0.1 only).
    assert again["connect"] == 200 and "upstream_tls" in again["answer"], again


def test_the_ca_key_and_the_credentials_key_are_nowhere_the_sandbox_can_read(traced: Traced) -> None:
    """Held: the deployment CA's private key (and host keys minted beside it) and the Fernet
    key file are outside what a process-backend sandbox can read, even looking under the
    data dir and the key file's own directory by name."""
    from tests.orchestrator.credentials.sandbox_search import sandbox_search

    w = traced.w
    ca = w.service.credential_ca
    assert ca is not None
    ca_key_line = key_pem(ca.key).decode().splitlines()[1]  # base64 of the key itself
    fernet_key = (w.base / "credentials.key").read_text().strip()
    run_67 = web_run(w.client, MEMBER)
    roots = [str(w.base), str(w.service.settings.layout.root), "/tmp", "/dev/shm", "/etc", "/root", "--mounts"]
    for canary in (ca_key_line, fernet_key):
        answer = tool(w.client, run_67, "shell", command=sandbox_search(canary, roots), timeout_s=120)
        assert answer["ok"], answer
        assert "nothing found" in answer["result"]["stdout"], answer["result"]["stdout"]
        assert canary not in json.dumps(answer)
    # By name: the files exist on the host, and the sandbox's open of each is refused.
    named = [w.base / "credentials.key", w.service.layout.state_dir / "ca" / "ca-key.pem"]
    assert all(p.is_file() for p in named)
    bundle = w.service.settings.sandbox_ca_bundle  # the control: the one CA file a sandbox reads
    probe = "; ".join(f"cat {shlex.quote(str(p))} >/dev/null 2>&1 && echo READ {p}" for p in [bundle, *named])
    answer = tool(w.client, run_67, "shell", command=probe + "; echo probed", timeout_s=60)
    assert answer["result"]["stdout"].split() == ["READ", str(bundle), "probed"], answer


def granted_run(w: World, *, ttl_s: int) -> tuple[str, str]:
    """A run of 67 in a new group session where 17 granted 67 `deploy` (67's own credentials
    deleted: they would come first); (run id, grant id)."""
    from tests.api_calls import group_session, start_run

    for own in w.client.get(f"/v1/users/{MEMBER}/credentials", headers={"X-Acting-User": str(MEMBER)}).json()["credentials"]:
        w.client.delete(f"/v1/users/{MEMBER}/credentials/{own['name']}", headers={"X-Acting-User": str(MEMBER)})
    sid = group_session(w.client)
    run_in_s = start_run(w.client, sid, trigger="group_message", speaker_user_id=MEMBER)["run_id"]
    body = {"credential": "deploy", "grantee_user_id": MEMBER, "session_id": sid, "ttl_s": ttl_s}
    made = w.client.post(f"/v1/users/{OWNER}/grants", json=body, headers={"X-Acting-User": str(OWNER)})
    assert made.status_code == 201, made.text
    return run_in_s, made.json()["grant_id"]


def test_an_open_connection_made_under_a_grant_ends_when_the_grant_expires(traced: Traced) -> None:
    """The sandbox opens a connection just before its grant expires and keeps it going (an
    answer that streams on; an upload would be the same): a revocation cuts it, and an
    expiry must too (it stayed open, acting under the grant after its end)."""
    w, port = traced.w, traced.port
    put_credential(w, OWNER, "deploy", [f"127.0.0.1:{port}"])
    run_in_s, _ = granted_run(w, ttl_s=4)
    _Traced.seen.clear()
    authority = f"127.0.0.1:{port}"
    started = time.monotonic()
    got = raw_tls(w, run_in_s, authority, f"GET /stream HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    took = time.monotonic() - started
    assert _Traced.seen == [f"Bearer {SECRET}"]  # the request went under the grant
    assert "first line" in got["answer"], got
    assert "late line" not in got["answer"] and took < 8, (took, got)
    assert w.service.egress is not None
    w.service.egress.flush_audit()
    used = [r for r in audit.entries(w.service.store, action="credential_used", limit=1000) if r.detail.get("credential") == "deploy"]
    assert [(r.detail["verdict"], r.detail["reason"]) for r in used][-1:] == [("cut", "grant_expired")], used


@pytest.mark.parametrize("sni", ["other.example.test", "-"])
def test_a_tls_name_other_than_the_connects_host_changes_nothing(traced: Traced, sni: str) -> None:
    """Held: the certificate and the upstream are the CONNECT's host's, whatever name (or
    none) the sandbox's TLS asks for; a request naming the other host is refused."""
    w, port = traced.w, traced.port
    put_credential(w, MEMBER, "traced", [f"127.0.0.1:{port}"])
    run_67 = web_run(w.client, MEMBER)
    authority = f"127.0.0.1:{port}"
    _Traced.seen.clear()
    same = raw_tls(w, run_67, authority, f"GET / HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode(), sni=sni)
    assert same["names"] == ["127.0.0.1"] and " 200 " in same["answer"].split("\r\n")[0], same
    other = raw_tls(w, run_67, authority, f"GET / HTTP/1.1\r\nHost: other.example.test\r\n\r\n".encode(), sni=sni)
    assert " 400 " in other["answer"].split("\r\n")[0] and "host_mismatch" in other["answer"], other
    assert _Traced.seen == [f"Bearer {SECRET}"]  # the one request that went up went to the CONNECT's host


def test_a_flood_of_refused_connections_never_hides_a_delegated_credentials_use(traced: Traced) -> None:
    """67's sandbox spends its audit budget on garbage connections (refused at once), then
    uses 17's credential: 17 must still find the use in the audit (it was only counted, in
    a summary naming verdicts, written at 67's next connection of a later minute if ever)."""
    from orchestrator.egress.audit_budget import ROWS_PER_WINDOW
    from tests.orchestrator.egress.test_egress_live import GARBAGE

    w, port = traced.w, traced.port
    put_credential(w, OWNER, "deploy", [f"127.0.0.1:{port}"])
    run_in_s, grant_id = granted_run(w, ttl_s=60)
    flood = tool(w.client, run_in_s, "shell", command=f"python3 -c {shlex.quote(GARBAGE)} {ROWS_PER_WINDOW + 50}", timeout_s=60)
    assert flood["result"]["exit_code"] == 0, flood
    _Traced.seen.clear()
    authority = f"127.0.0.1:{port}"
    got = raw_tls(w, run_in_s, authority, f"GET / HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    assert " 200 " in got["answer"].split("\r\n")[0] and _Traced.seen == [f"Bearer {SECRET}"], got
    assert w.service.egress is not None
    w.service.egress.flush_audit(10)
    used = [r for r in audit.entries(w.service.store, action="credential_used", limit=5000) if r.detail.get("grant_id") == grant_id]
    assert len(used) == 1 and used[0].owner_user_id == OWNER and used[0].detail["run_id"] == run_in_s, used
    # The next uses this minute are counted (the budget still bounds the rows), under the credential's name.
    raw_tls(w, run_in_s, authority, f"GET / HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    w.service.egress.flush_audit(10)
    assert len([r for r in audit.entries(w.service.store, action="credential_used", limit=5000) if r.detail.get("grant_id") == grant_id]) == 1


# In the sandbox: intercepted GETs one after another for argv[2] seconds; prints how many.
HAMMER_SCRIPT = CONNECT_PRELUDE + r"""
import ssl, sys, time
authority, until = sys.argv[1], time.monotonic() + float(sys.argv[2])
context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
done = 0
while time.monotonic() < until:
    s, head = connect(authority)
    if b" 200 " in head:
        try:
            t = context.wrap_socket(s, server_hostname=authority.rsplit(":", 1)[0])
            t.sendall(f"GET / HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            while t.recv(65536):
                pass
            done += 1
        except (OSError, ssl.SSLError):
            pass
    s.close()
print(done)
"""


def test_uses_noted_while_the_owner_replaces_the_credential_never_bring_the_old_hosts_back(traced: Traced) -> None:
    """68's sandbox uses its credential as fast as it can (each use notes `last_used_at`)
    while 68 moves the credential between two hosts: the credential in force must always be
    the last one stored (a use noted during a replacement put the old hosts back, with the
    new secret: the new value then went to the old host)."""
    w, port = traced.w, traced.port
    hosts = ([f"127.0.0.1:{port}"], [f"127.0.0.1:{port}", f"{SLOW_NAME}:{traced.named_port}"])
    put_credential(w, THIRD, "busy", hosts[0])
    run_68 = web_run(w.client, THIRD)
    command = " ".join(["python3", "-c", shlex.quote(HAMMER_SCRIPT), shlex.quote(f"127.0.0.1:{port}"), "12"])
    hammer: dict = {}
    thread = threading.Thread(target=lambda: hammer.update(tool(w.client, run_68, "shell", command=command, timeout_s=60)))
    thread.start()
    time.sleep(2)  # the sandbox is at it
    stale = []
    for i in range(120):
        put_credential(w, THIRD, "busy", hosts[i % 2])
        time.sleep(0.03)
        now = [c for c in w.client.get(f"/v1/users/{THIRD}/credentials", headers={"X-Acting-User": str(THIRD)}).json()["credentials"]]
        if now[0]["hosts"] != hosts[i % 2]:
            stale.append((i, now[0]["hosts"]))
        if not thread.is_alive():
            break
    thread.join(60)
    assert hammer["result"]["exit_code"] == 0 and int(hammer["result"]["stdout"]) > 20, hammer
    assert stale == [], stale
