"""Credentials end to end with real agents of the process backend (as root, each in a network
namespace with only `lo` and its forwarder), a TLS upstream on 127.0.0.1 whose CA the test
made, and the secret looked for, byte for byte, everywhere it must never be."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient

from orchestrator import audit
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.api_calls import group_session, start_run, tool
from tests.conftest import API_TOKEN, TEST_ROOT, admin_headers, make_settings
from tests.orchestrator.credentials.sandbox_search import sandbox_search
from orchestrator.credentials.probe import UPSTREAM_CA_NAME, echo_upstream, https_command, make_upstream_ca
from tests.orchestrator.egress.upstream import loopback_upstream
from tests.orchestrator.sandboxes.test_process_network import web_run

AS_ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(not AS_ROOT, reason="a sandbox network of its own needs a root orchestrator")

SECRET = "ghp_SECRETvalue0123456789abcdefXYZ"
OWNER, MEMBER = 17, 67
THIRD = 68  # a user whose sandbox starts after its credential is set (placeholders come at the start)


def acting(user_id: int) -> dict[str, str]:
    return {"X-Acting-User": str(user_id)}


@dataclass
class World:
    client: TestClient
    service: OrchestratorService
    base: Path
    upstream_ca: Path  # the test CA's certificate: what the proxy verifies upstreams against
    upstream: int  # has 67's credential
    other: int  # no credential: a plain tunnel
    plain: int  # a plain-HTTP upstream, for the http:// refusal
    log_file: Path


@contextmanager
def world(uid_slice: int = 0, **overrides: object) -> Iterator[World]:
    """A server with credentials on (a key file outside its data dir), egress to three
    loopback upstreams allowed for 17, 67 and 68; `overrides`: more settings (a backend).
    `uid_slice`: two servers live at once, each on a slice of the run's uid block."""
    base = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="credentials-"))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    upstream_ca = base / "upstream-ca.pem"
    chain = make_upstream_ca(upstream_ca)
    key_file = base / "credentials.key"
    key_file.write_text(Fernet.generate_key().decode())
    key_file.chmod(0o600)
    log_file = base / "server.log"
    handler = logging.FileHandler(log_file)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        with echo_upstream(chain) as upstream, echo_upstream(chain) as other, loopback_upstream() as plain:
            settings = make_settings(
                data, egress_allow_loopback=True, credentials_key_file=key_file, egress_upstream_ca_bundle=upstream_ca,
                sandbox_uid_base=int(os.environ.get("ORCH_SANDBOX_UID_BASE", "100000")) + 1000 * uid_slice, max_user_id=999,
                **overrides,
            )  # fmt: skip
            service = OrchestratorService(settings)
            try:
                with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
                    for user in (OWNER, MEMBER, THIRD):
                        allow = [f"127.0.0.1:{upstream}", f"127.0.0.1:{other}", f"127.0.0.1:{plain}"]
                        r = client.put(f"/v1/admin/users/{user}/egress", json={"allow": allow}, headers=admin_headers())
                        assert r.status_code == 200, r.text
                    yield World(client, service, base, upstream_ca, upstream, other, plain, log_file)
            finally:
                service.close()
                if overrides.get("backend") == "docker":
                    from tests.orchestrator.sandboxes.docker.conftest import remove_containers

                    remove_containers(data)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def w() -> Iterator[World]:
    with world() as made:
        yield made


def put_credential(w: World, user_id: int, name: str, hosts: list[str], **more: object) -> dict:
    body = {"secret": SECRET, "hosts": hosts, "header": "Authorization", "template": "Bearer {secret}", **more}
    r = w.client.put(f"/v1/users/{user_id}/credentials/{name}", json=body, headers=acting(user_id))
    assert r.status_code == 200, r.text
    return r.json()


def https(w: World, run_id: str, target: str, *headers: str, insecure: bool = False) -> dict:
    answer = tool(w.client, run_id, "shell", command=https_command(target, *headers, insecure=insecure), timeout_s=60)
    assert answer["ok"], answer
    assert answer["result"]["exit_code"] == 0, answer
    return json.loads(answer["result"]["stdout"])


def echoed(answer: dict) -> list[tuple[str, str]]:
    assert answer.get("status") == 200, answer
    return [(k, v) for k, v in json.loads(answer["body"])["headers"]]


def authorization(answer: dict) -> list[str]:
    return [v for k, v in echoed(answer) if k.lower() == "authorization"]


def audit_rows(w: World, action: str) -> list[audit.AuditEntry]:
    assert w.service.egress is not None
    w.service.egress.flush_audit()
    return audit.entries(w.service.store, action=action, limit=1000)


def test_67s_request_arrives_with_67s_token_and_17s_carries_none(w: World) -> None:
    out = put_credential(w, MEMBER, "github", [f"127.0.0.1:{w.upstream}"], env="GITHUB_TOKEN")
    assert out["name"] == "github" and "secret" not in out and SECRET not in json.dumps(out)
    run_67, run_17 = web_run(w.client, MEMBER), web_run(w.client, OWNER)
    got = https(w, run_67, f"127.0.0.1:{w.upstream}/echo", "Authorization: Bearer cred:github")
    assert authorization(got) == [f"Bearer {SECRET}"], got  # the placeholder replaced, not doubled
    assert "Sandbox Orchestrator egress CA" not in got["head"]
    # A second Host (another target for the header) is refused, and the refusal quotes no secret.
    smuggled = https(w, run_67, f"127.0.0.1:{w.upstream}/echo", "Host: elsewhere.example")
    assert smuggled["status"] == 400 and "host_mismatch" in smuggled["head"] and SECRET not in json.dumps(smuggled)
    theirs = https(w, run_17, f"127.0.0.1:{w.upstream}/echo", insecure=True)
    assert authorization(theirs) == [], theirs
    listed = w.client.get(f"/v1/users/{MEMBER}/credentials", headers=acting(MEMBER)).json()["credentials"]
    assert [c["name"] for c in listed] == ["github"] and listed[0]["last_used_at"] is not None
    used = [r for r in audit_rows(w, "credential_used") if r.runtime_user_id == MEMBER]
    assert used and used[-1].detail["credential"] == "github" and used[-1].detail["bytes_down"] > 0
    assert used[-1].detail["run_id"] == run_67


def test_a_host_without_a_credential_is_a_plain_tunnel_with_the_upstreams_own_chain(w: World) -> None:
    from cryptography import x509

    run_67 = web_run(w.client, MEMBER)
    plain = https(w, run_67, f"127.0.0.1:{w.other}/echo", "Authorization: Bearer cred:github", insecure=True)
    issuer = x509.load_pem_x509_certificate(plain["peer_cert"].encode()).issuer.rfc4514_string()
    assert UPSTREAM_CA_NAME in issuer, issuer
    assert authorization(plain) == ["Bearer cred:github"]  # untouched: what the sandbox sent
    put_credential(w, MEMBER, "github", [f"127.0.0.1:{w.upstream}"], env="GITHUB_TOKEN")
    injected = https(w, run_67, f"127.0.0.1:{w.upstream}/echo")
    issuer = x509.load_pem_x509_certificate(injected["peer_cert"].encode()).issuer.rfc4514_string()
    assert "Sandbox Orchestrator egress CA" in issuer, issuer


def test_plain_http_to_a_credentials_host_is_refused(w: World) -> None:
    put_credential(w, MEMBER, "plainsite", [f"127.0.0.1:{w.plain}"])
    run_67 = web_run(w.client, MEMBER)
    from tests.orchestrator.egress.sandbox_client import command

    answer = tool(w.client, run_67, "shell", command=command("get", f"127.0.0.1:{w.plain}/hello"), timeout_s=60)
    got = json.loads(answer["result"]["stdout"])
    assert got["status"] == 403, got
    assert "credential_plain_http" in got["head"] and "never sent in clear" in got["body"]
    r = w.client.delete(f"/v1/users/{MEMBER}/credentials/plainsite", headers=acting(MEMBER))
    assert r.status_code == 204, r.text


def test_a_grant_of_17_reaches_67s_runs_in_that_session_only_until_revoked(w: World) -> None:
    put_credential(w, OWNER, "deploy", [f"127.0.0.1:{w.upstream}"])
    w.client.delete(f"/v1/users/{MEMBER}/credentials/github", headers=acting(MEMBER))
    sid = group_session(w.client)
    other_sid = group_session(w.client)
    run_in_s = start_run(w.client, sid, trigger="group_message", speaker_user_id=MEMBER)["run_id"]
    run_elsewhere = start_run(w.client, other_sid, trigger="group_message", speaker_user_id=MEMBER)["run_id"]
    target = f"127.0.0.1:{w.upstream}/echo"
    assert authorization(https(w, run_in_s, target, insecure=True)) == []

    # 67 cannot grant 17's credential, nor can the bot without acting for 17.
    body = {"credential": "deploy", "grantee_user_id": MEMBER, "session_id": sid, "ttl_s": 60}
    refused = w.client.post(f"/v1/users/{OWNER}/grants", json=body, headers=acting(MEMBER))
    assert refused.status_code == 403, refused.text
    assert w.client.post(f"/v1/users/{OWNER}/grants", json=body).status_code == 403
    # 67 naming it as its own: 67 has no such credential.
    as_own = w.client.post(f"/v1/users/{MEMBER}/grants", json={**body, "grantee_user_id": OWNER}, headers=acting(MEMBER))
    assert as_own.status_code == 404, as_own.text
    too_long = w.client.post(f"/v1/users/{OWNER}/grants", json={**body, "ttl_s": 10**9}, headers=acting(OWNER))
    assert too_long.status_code == 422, too_long.text

    # Nor a tool call: no tool a model is given touches credentials or grants, and a made-up
    # one is an unknown tool.
    names = [t["name"] for t in w.client.get("/v1/tools").json()["tools"]]
    assert names and not [n for n in names if "grant" in n or "credential" in n], names
    made_up = tool(w.client, run_in_s, "grant_credential", credential="deploy", grantee_user_id=MEMBER)
    assert not made_up["ok"], made_up
    assert w.client.get(f"/v1/users/{OWNER}/grants", headers=acting(OWNER)).json()["granted"] == []

    made = w.client.post(f"/v1/users/{OWNER}/grants", json=body, headers=acting(OWNER))
    assert made.status_code == 201, made.text
    grant = made.json()
    assert grant["grantor_user_id"] == OWNER and grant["grantee_user_id"] == MEMBER and grant["session_id"] == sid
    assert authorization(https(w, run_in_s, target)) == [f"Bearer {SECRET}"]
    # A run of 67 in S is told what it may use, whose it is and until when; one elsewhere is not.
    context = start_run(w.client, sid, trigger="group_message", speaker_user_id=MEMBER)
    assert [(d["credential"], d["owner_user_id"], d["expires_at"]) for d in context["delegated_credentials"]] == [
        ("deploy", OWNER, grant["expires_at"])
    ]
    assert f"Delegated credential `deploy` of user #{OWNER}" in context["prompt_identity_section"]
    assert grant["expires_at"] in context["prompt_identity_section"] and SECRET not in json.dumps(context)
    elsewhere = start_run(w.client, other_sid, trigger="group_message", speaker_user_id=MEMBER)
    assert elsewhere["delegated_credentials"] == [] and "Delegated" not in (elsewhere["prompt_identity_section"] or "")
    assert authorization(https(w, run_elsewhere, target, insecure=True)) == []
    listed = w.client.get(f"/v1/users/{MEMBER}/grants", headers=acting(MEMBER)).json()
    assert [g["grant_id"] for g in listed["held"]] == [grant["grant_id"]] and listed["granted"] == []
    assert [g["grant_id"] for g in w.client.get(f"/v1/users/{OWNER}/grants", headers=acting(OWNER)).json()["granted"]] == [
        grant["grant_id"]
    ]

    # An open tunnel (an answer still streaming) is cut by the revocation.
    holding = w.client.post(
        f"/v1/runs/{run_in_s}/tools/process_start",
        json={"arguments": {"command": https_command(f"127.0.0.1:{w.upstream}/stream?s=30")}},
    )
    assert holding.status_code == 200 and holding.json()["ok"], holding.text
    process_id = holding.json()["result"]["process_id"]
    deadline = time.monotonic() + 20
    time.sleep(2)  # the stream's first line is through
    assert w.client.delete(f"/v1/grants/{grant['grant_id']}", headers=acting(MEMBER)).status_code == 403
    started = time.monotonic()
    assert w.client.delete(f"/v1/grants/{grant['grant_id']}", headers=acting(OWNER)).status_code == 204
    while time.monotonic() < deadline:
        out = tool(w.client, run_in_s, "process_output", process_id=process_id)["result"]
        if out["complete"]:
            break
        time.sleep(0.2)
    assert time.monotonic() - started < 10, "the revoked tunnel stayed open"
    stdout = "".join(c["text"] for c in out["chunks"] if c["stream"] == "stdout")
    assert "first line" in json.loads(stdout)["body"], out
    assert authorization(https(w, run_in_s, target, insecure=True)) == []

    # Expiry needs nobody: a grant of 2 s serves its session, then the next request goes without.
    short = w.client.post(f"/v1/users/{OWNER}/grants", json={**body, "ttl_s": 2}, headers=acting(OWNER))
    assert short.status_code == 201, short.text
    assert authorization(https(w, run_in_s, target)) == [f"Bearer {SECRET}"]
    time.sleep(2.5)
    assert authorization(https(w, run_in_s, target, insecure=True)) == []

    rows = {a: [r for r in audit_rows(w, a) if r.detail.get("grant_id") == grant["grant_id"]]
            for a in ("credential_granted", "credential_used", "credential_grant_revoked")}  # fmt: skip
    assert len(rows["credential_granted"]) == 1 and len(rows["credential_grant_revoked"]) == 1
    assert any(r.detail["reason"] == "credential_revoked" for r in rows["credential_used"]), rows["credential_used"]
    assert any(r.detail["run_id"] == run_in_s and r.runtime_user_id == MEMBER for r in rows["credential_used"])


def secret_is_nowhere(w: World, roots: list[str]) -> None:
    """68's request carries its token; the sandbox finds it nowhere it can look (`roots`, or
    every mount of its own with `--mounts`), and neither do the log, audit, DB nor /metrics."""
    put_credential(w, THIRD, "github", [f"127.0.0.1:{w.upstream}"], env="GITHUB_TOKEN")
    run = web_run(w.client, THIRD)
    assert authorization(https(w, run, f"127.0.0.1:{w.upstream}/echo")) == [f"Bearer {SECRET}"]
    # Every TLS client in the sandbox is pointed at the bundle with the deployment CA, git too.
    named = tool(w.client, run, "shell", command='echo "$SSL_CERT_FILE $GIT_SSL_CAINFO $NODE_EXTRA_CA_CERTS"')["result"]
    assert named["stdout"].split() == [str(w.service.settings.sandbox_ca_bundle)] * 3, named
    # and git sends pushes up to 64 MiB with a Content-Length, which the proxy forwards
    buffer = tool(w.client, run, "shell", command="git config --get http.postBuffer")["result"]
    assert buffer["stdout"].strip() == str(64 * 1024 * 1024), buffer
    # The search finds what is there: a canary the sandbox wrote into its HOME and /tmp.
    canary = "canary-" + SECRET[::-1]
    planted = tool(w.client, run, "shell", command=f"printf %s {canary[:8]} {canary[8:]} > ~/c.txt; cp ~/c.txt /tmp/c.txt")
    assert planted["ok"], planted
    seen = tool(w.client, run, "shell", command=sandbox_search(canary, roots), timeout_s=300)["result"]["stdout"]
    assert "FOUND" in seen and "c.txt" in seen, seen
    tool(w.client, run, "shell", command="rm -f ~/c.txt /tmp/c.txt")
    looked = tool(w.client, run, "shell", command=sandbox_search(SECRET, roots), timeout_s=300)
    assert looked["ok"] and looked["result"]["exit_code"] == 0, looked
    report = looked["result"]["stdout"]
    assert "nothing found" in report, looked
    assert int(report.split("searched ")[1].split()[0]) > 20, report  # it did look
    assert "GITHUB_TOKEN=cred:github" in report, looked
    assert SECRET not in json.dumps(looked)  # nor in what the agent answered
    metrics = w.client.get("/metrics", headers=admin_headers())
    assert metrics.status_code == 200 and SECRET not in metrics.text
    assert w.service.egress is not None
    w.service.egress.flush_audit()
    for path in Path(w.service.settings.layout.root).rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET.encode() not in w.log_file.read_bytes()
    for row in audit.entries(w.service.store, limit=10000):
        assert SECRET not in json.dumps(row.detail)


def test_the_secret_is_nowhere_the_sandbox_server_or_operator_can_read(w: World) -> None:
    secret_is_nowhere(w, [str(w.service.settings.layout.root), "/tmp", "/dev/shm", "/home", "/root", "/etc"])


def test_a_bwrap_sandbox_sees_the_deployment_bundle_and_gets_the_header() -> None:
    """bwrap shows /usr and /etc only: the bundle under the data dir is bound in read-only."""
    with world(1, process_sandbox="bwrap") as bw:
        put_credential(bw, MEMBER, "github", [f"127.0.0.1:{bw.upstream}"])
        run = web_run(bw.client, MEMBER)
        assert authorization(https(bw, run, f"127.0.0.1:{bw.upstream}/echo")) == [f"Bearer {SECRET}"]
        bundle = str(bw.service.settings.sandbox_ca_bundle)
        written = tool(bw.client, run, "shell", command=f"echo x >> {bundle}")["result"]
        assert written["exit_code"] != 0, written  # read-only


def test_intercepted_connections_count_against_the_users_connection_cap() -> None:
    """Interception costs the proxy more than a tunnel: it stays inside the user's caps."""
    with world(2, egress_max_connections=2) as capped:
        put_credential(capped, MEMBER, "github", [f"127.0.0.1:{capped.upstream}"])
        run = web_run(capped.client, MEMBER)
        one = https_command(f"127.0.0.1:{capped.upstream}/stream?s=3")
        answer = tool(capped.client, run, "shell", command=f"({one}) & ({one}) & sleep 1; {one}; wait", timeout_s=60)
        results = [json.loads(line) for line in answer["result"]["stdout"].splitlines() if line.startswith("{")]
        assert sorted(r["connect"] for r in results) == [200, 200, 429], results
        refused = next(r for r in results if r["connect"] == 429)
        assert "too_many_connections" in refused["body"] or "connections" in refused["body"], refused
