"""The operator's key for credentials at rest: Fernet (AES-128-CBC with HMAC-SHA256, from
`cryptography`), one key or several. `ORCH_CREDENTIALS_KEY` (or the file
`ORCH_CREDENTIALS_KEY_FILE`, outside the data dir) holds keys separated by commas or
newlines: the first encrypts, every one decrypts, so a rotation puts the new key first and
keeps the old one until every row is re-encrypted (`CredentialStore.rotate`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from orchestrator.startup_checks import StartupRefused

# A known plaintext, encrypted with the key when the first credential is stored: a start with
# another key is refused before any connection needs a secret.
CHECK_PLAINTEXT = b"sandbox-orchestrator credentials key check"


class CredentialsKeyRefused(StartupRefused):
    code = "credentials_key_refused"


def parse_keys(text: str, *, source: str) -> MultiFernet:
    """Pure: the keys in `text` (commas or newlines between), or CredentialsKeyRefused."""
    parts = [p.strip() for p in text.replace("\n", ",").split(",") if p.strip()]
    if not parts:
        raise CredentialsKeyRefused(f"{source} holds no key; make one with `orchestrator credentials new-key`")
    keys = []
    for index, part in enumerate(parts, 1):
        try:
            keys.append(Fernet(part.encode()))
        except (ValueError, TypeError):
            raise CredentialsKeyRefused(
                f"key {index} of {source} is not a Fernet key (32 url-safe base64 bytes); make one with "
                "`orchestrator credentials new-key`"
            ) from None
    return MultiFernet(keys)


def read_key_file(path: Path, data_dir: Path) -> str:
    """The key file's text. Refused inside the data dir (a backup of the data dir must not
    carry the key with it), when not a regular file, or readable by group or others."""
    real, data = Path(os.path.realpath(path)), Path(os.path.realpath(data_dir))
    if real == data or data in real.parents:
        raise CredentialsKeyRefused(f"ORCH_CREDENTIALS_KEY_FILE {path} is inside the data dir {data_dir}; keep it elsewhere")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise CredentialsKeyRefused(f"ORCH_CREDENTIALS_KEY_FILE {path} cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(file.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise CredentialsKeyRefused(
                f"ORCH_CREDENTIALS_KEY_FILE {path} must be a regular file readable by its owner only (chmod 600)"
            )
        return file.read(64 * 1024).decode("ascii", errors="replace")


def load_keys(key: str, key_file: Path | None, data_dir: Path) -> MultiFernet | None:
    """The configured keys, None when neither setting is given."""
    if key and key_file is not None:
        raise CredentialsKeyRefused("set ORCH_CREDENTIALS_KEY or ORCH_CREDENTIALS_KEY_FILE, not both")
    if key_file is not None:
        return parse_keys(read_key_file(key_file, data_dir), source="ORCH_CREDENTIALS_KEY_FILE")
    if key:
        return parse_keys(key, source="ORCH_CREDENTIALS_KEY")
    return None


def check_token(keys: MultiFernet) -> bytes:
    return keys.encrypt(CHECK_PLAINTEXT)


def verify_check(keys: MultiFernet, token: bytes) -> bool:
    try:
        return keys.decrypt(token) == CHECK_PLAINTEXT
    except InvalidToken:
        return False


def new_key() -> str:
    return Fernet.generate_key().decode()
