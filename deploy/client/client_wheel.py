"""A PEP 517 build backend for `sandbox-orchestrator-client`: the repository's orchestrator/client/
packed as a wheel, with nothing else of the server.

Standard library only (no build requirement to fetch), and no staging copy: the wheel's files are
read straight from the checkout two levels up. The wheel has no `orchestrator/__init__.py`, so
`orchestrator` is an implicit namespace package there and `orchestrator.client` imports as it does
with the server installed. Reading the files is pure (`wheel_entries`); writing the zip is the
only side effect (`build_wheel`).
"""

from __future__ import annotations

import base64
import hashlib
import tomllib
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
PACKAGE = Path("orchestrator") / "client"
# Fixed zip timestamps: the same checkout builds the same bytes.
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def project_table() -> dict[str, Any]:
    return tomllib.loads((HERE / "pyproject.toml").read_text())["project"]


def repository_version() -> str:
    """The server's version (the top-level pyproject.toml), so the two never disagree."""
    return tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["version"]


def normalized(name: str) -> str:
    return name.replace("-", "_")


def metadata_text(project: dict[str, Any], version: str, readme: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {version}",
        f"Summary: {project['description']}",
        f"License: {project['license']}",
        f"Requires-Python: {project['requires-python']}",
        *(f"Requires-Dist: {requirement}" for requirement in project["dependencies"]),
        "Description-Content-Type: text/markdown",
    ]
    return "\n".join(lines) + "\n\n" + readme


WHEEL_TEXT = "Wheel-Version: 1.0\nGenerator: sandbox-orchestrator deploy/client/client_wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def package_files(repository: Path) -> list[tuple[str, bytes]]:
    """Every .py file of orchestrator/client/ (sorted; caches left out), as (path in the wheel, bytes)."""
    root = repository / PACKAGE
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    if not (root / "__init__.py").is_file():
        raise FileNotFoundError(f"{root} is not the client package: build from a checkout of the repository")
    return [(p.relative_to(repository).as_posix(), p.read_bytes()) for p in files]


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def wheel_entries(repository: Path, project: dict[str, Any], version: str, readme: str) -> list[tuple[str, bytes]]:
    """Pure: the wheel's files in order, RECORD last."""
    dist_info = f"{normalized(project['name'])}-{version}.dist-info"
    entries = package_files(repository) + [
        (f"{dist_info}/METADATA", metadata_text(project, version, readme).encode()),
        (f"{dist_info}/WHEEL", WHEEL_TEXT.encode()),
    ]
    record = "".join(record_line(path, data) + "\n" for path, data in entries) + f"{dist_info}/RECORD,,\n"
    return entries + [(f"{dist_info}/RECORD", record.encode())]


def wheel_name(project: dict[str, Any], version: str) -> str:
    return f"{normalized(project['name'])}-{version}-py3-none-any.whl"


# PEP 517 hooks ------------------------------------------------------------------------------


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None) -> str:
    project, version = project_table(), repository_version()
    name = wheel_name(project, version)
    entries = wheel_entries(REPOSITORY, project, version, (HERE / project["readme"]).read_text())
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for path, data in entries:
            info = zipfile.ZipInfo(path, date_time=ZIP_DATE)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return name
