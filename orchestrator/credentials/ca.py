"""The deployment's own CA, made at the first start with credentials on, and the host
certificates the egress proxy presents when it terminates TLS for a credential's host.

The CA key stays in a root-only directory of the state dir (`state/ca/`, 0700, the key
0600); its certificate, appended to the host's CA bundle, is the one file sandboxes get
(`ca/sandbox-bundle.pem` under the data dir, 0644). Host certificates are minted on first
use and kept in a bounded LRU cache (with their SSL contexts: a handshake with a cached one
costs no signature).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from orchestrator.egress.policy import literal_address

CA_VALIDITY = datetime.timedelta(days=3650)
HOST_VALIDITY = datetime.timedelta(days=7)
CACHE_SIZE = 256  # host certificates (with their contexts) kept at once


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sandbox Orchestrator"), x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(common: str = "Sandbox Orchestrator egress CA") -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common)).issuer_name(_name(common)).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return key, cert


def mint_host(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, host: str, *, validity: datetime.timedelta = HOST_VALIDITY
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A leaf for `host` (a name or an IP literal) signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    address = literal_address(host)
    alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(address)) if address is not None else x509.DNSName(host)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(host[:64])).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    return key, cert


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class DeploymentCA:
    """Loads the CA from `private_dir` (made there at the first start), writes the sandbox
    bundle, and mints host contexts on demand."""

    def __init__(self, private_dir: Path, bundle_path: Path, host_bundle: Path, *, cache_size: int = CACHE_SIZE) -> None:
        private_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(private_dir, 0o700)
        key_path, cert_path = private_dir / "ca-key.pem", private_dir / "ca-cert.pem"
        if key_path.is_file() and cert_path.is_file():
            self.key = serialization.load_pem_private_key(key_path.read_bytes(), None)
            self.cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            assert isinstance(self.key, ec.EllipticCurvePrivateKey)
        else:
            self.key, self.cert = make_ca()
            _write_atomic(key_path, key_pem(self.key), 0o600)
            _write_atomic(cert_path, pem(self.cert), 0o644)
        os.chmod(key_path, 0o600)
        self.bundle_path = bundle_path
        self._private_dir = private_dir
        bundle_path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        host = host_bundle.read_bytes() if host_bundle.is_file() else b""
        _write_atomic(bundle_path, host.rstrip(b"\n") + b"\n" + pem(self.cert), 0o644)
        self._cache: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.minted = 0

    def context_for(self, host: str) -> ssl.SSLContext:
        """The server-side context presenting a certificate for `host` (minted on first use)."""
        with self._lock:
            context = self._cache.get(host)
            if context is not None:
                self._cache.move_to_end(host)
                return context
        key, cert = mint_host(self.key, self.cert, host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])  # one HTTP/1.1 request a connection (docs/credentials.md)
        # ssl loads a chain only from files: a private temporary file, gone at once.
        with tempfile.NamedTemporaryFile(prefix=".host-", suffix=".pem", dir=self._private_dir) as chain:
            os.fchmod(chain.fileno(), 0o600)
            chain.write(key_pem(key) + pem(cert))
            chain.flush()
            context.load_cert_chain(chain.name)
        with self._lock:
            self.minted += 1
            self._cache[host] = context
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return context

    def is_cached(self, host: str) -> bool:
        with self._lock:
            return host in self._cache

    @property
    def cached(self) -> int:
        return len(self._cache)
