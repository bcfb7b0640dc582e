"""Credentials at start: the key, checked against the stored credentials (a wrong or missing
key refuses the start with what to do), and the deployment CA when egress is on."""

from __future__ import annotations

from cryptography.fernet import MultiFernet

from orchestrator.credentials.ca import DeploymentCA
from orchestrator.credentials.keys import CredentialsKeyRefused, load_keys
from orchestrator.credentials.store import CredentialStore
from orchestrator.settings import CredentialSettings
from orchestrator.state_store import StateStore


def configured_keys(settings: CredentialSettings) -> MultiFernet | None:
    key = settings.key.get_secret_value() if settings.key is not None else ""
    return load_keys(key, settings.key_file, settings.layout.root)


def open_credentials(settings: CredentialSettings, store: StateStore) -> tuple[CredentialStore | None, DeploymentCA | None]:
    keys = configured_keys(settings)
    if keys is None:
        with store.read() as tx:
            stored = tx.one("SELECT COUNT(*) AS n FROM credentials")["n"]  # type: ignore[index]
        if stored:
            raise CredentialsKeyRefused(
                f"{stored} credential(s) are stored, but neither ORCH_CREDENTIALS_KEY nor ORCH_CREDENTIALS_KEY_FILE is "
                "set: start with the key they were stored with"
            )
        return None, None
    credentials = CredentialStore(store, keys, grant_max_s=settings.grant_max_s)
    if settings.egress == "off":
        return credentials, None
    layout = settings.layout
    ca = DeploymentCA(layout.state_dir / "ca", settings.sandbox_ca_bundle, settings.egress_ca_bundle)
    return credentials, ca
