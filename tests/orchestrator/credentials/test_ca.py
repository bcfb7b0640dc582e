"""The deployment CA: made once and kept (the key root-only), its certificate appended to the
host's bundle for sandboxes, host certificates verifying against that bundle, and the cache
of host contexts bounded."""

from __future__ import annotations

import socket
import ssl
import stat
import threading
from pathlib import Path

from orchestrator.credentials.ca import DeploymentCA


def test_the_ca_is_made_once_its_key_root_only_and_its_certificate_in_the_sandbox_bundle(tmp_path: Path) -> None:
    host_bundle = tmp_path / "host.pem"
    host_bundle.write_text("# the host's bundle\n")
    ca = DeploymentCA(tmp_path / "private", tmp_path / "public" / "bundle.pem", host_bundle)
    again = DeploymentCA(tmp_path / "private", tmp_path / "public" / "bundle.pem", host_bundle)
    assert ca.cert == again.cert
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "private" / "ca-key.pem").stat().st_mode) == 0o600
    bundle = (tmp_path / "public" / "bundle.pem").read_text()
    assert bundle.startswith("# the host's bundle") and "BEGIN CERTIFICATE" in bundle and "PRIVATE KEY" not in bundle
    assert stat.S_IMODE((tmp_path / "public" / "bundle.pem").stat().st_mode) == 0o644


def test_a_host_certificate_verifies_against_the_sandbox_bundle_for_that_host_only(tmp_path: Path) -> None:
    ca = DeploymentCA(tmp_path / "private", tmp_path / "bundle.pem", tmp_path / "none.pem")
    for host, asked, ok in (("127.0.0.1", "127.0.0.1", True), ("api.example.org", "api.example.org", True), ("api.example.org", "evil.example.org", False)):
        server_ctx = ca.context_for(host)
        a, b = socket.socketpair()
        result: list[object] = []

        def serve() -> None:
            try:
                server_ctx.wrap_socket(a, server_side=True).close()
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve)
        thread.start()
        client = ssl.create_default_context(cafile=str(tmp_path / "bundle.pem"))
        try:
            client.wrap_socket(b, server_hostname=asked).close()
            result.append(True)
        except ssl.SSLCertVerificationError:
            result.append(False)
        b.close()
        thread.join()
        a.close()
        assert result == [ok], (host, asked)


def test_the_host_context_cache_is_bounded(tmp_path: Path) -> None:
    ca = DeploymentCA(tmp_path / "private", tmp_path / "bundle.pem", tmp_path / "none.pem", cache_size=4)
    first = ca.context_for("h0.example.org")
    assert ca.context_for("h0.example.org") is first and ca.minted == 1
    for i in range(10):
        ca.context_for(f"h{i}.example.org")
    assert ca.cached == 4 and ca.minted == 10
    assert ca.context_for("h0.example.org") is not first  # evicted, minted again
