"""Every `ORCH_` variable the README documents still sets its setting, and the package sections
built from `Settings` carry it under their own names (each package receives only its section)."""

from __future__ import annotations

import os
import re
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import SecretStr, ValidationError

from orchestrator.settings import SECTIONS, PreviewSettings, SandboxSettings, Section, Settings

README = Path(__file__).resolve().parents[2] / "README.md"

# A value for the variables whose type alone does not give one that validates.
SAMPLES: dict[str, str] = {
    "ORCH_K8S_NAMESPACE": "sandboxes-two",
    "ORCH_K8S_DATA_PVC": "orchestrator-data",
    "ORCH_K8S_RUNTIME_CLASS": "gvisor",
    "ORCH_K8S_TOLERATIONS": '[{"key": "sandboxes", "value": "true", "effect": "NoSchedule"}]',
    "ORCH_EGRESS_ALLOW": "example.org, *.example.net",
    "ORCH_EGRESS_DNS_SERVERS": "127.0.0.53",
    "ORCH_PREVIEW_LISTEN": "127.0.0.1:8710",
    "ORCH_PREVIEW_BASE_URL": "https://previews.example.org",
    "ORCH_PUBLIC_BASE_URL": "https://files.example.org",
    "ORCH_RUNTIME_IDENTITY": "owner",
    "ORCH_IMAGE_REGISTRY": "127.0.0.1:5000",
}


# Section fields whose name is not their setting's without a prefix.
RENAMED = {("mode", "egress"), ("mechanism", "disk_quota")}


def documented_variables() -> list[str]:
    return sorted(set(re.findall(r"^\| `(ORCH_[A-Z0-9_]+)` \|", README.read_text(), flags=re.M)))


def _candidates(annotation: Any, default: Any) -> list[str]:
    """Values of the field's type that differ from its default, most likely to validate first."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) is Literal:
        return [str(value) for value in args if value != default]
    if args and typing.get_origin(annotation) is not tuple:  # X | None
        return _candidates(args[0], default)
    if annotation is bool:
        return [str(not default).lower()]
    if annotation in (int, float):
        base = default if isinstance(default, (int, float)) and not isinstance(default, bool) else 0
        numbers = [base + 1, base * 2, base - 1, 1, 2, 3, 50, 1000, 100_000]
        return [str(annotation(n)) for n in numbers if n != default]
    if annotation is Path:
        return ["/srv/orchestrator-sample"]
    if annotation is SecretStr:
        return ["sample-secret-value"]
    return ["sample"]


def _sample_settings(variable: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, str]:
    field = variable.removeprefix("ORCH_").lower()
    info = Settings.model_fields[field]
    candidates = [SAMPLES[variable]] if variable in SAMPLES else _candidates(info.annotation, info.default)
    errors = []
    for raw in candidates:
        monkeypatch.setenv(variable, raw)
        try:
            return Settings(_env_file=None, data_dir=Path("/srv/orchestrator-data")) if field != "data_dir" else Settings(_env_file=None), raw  # type: ignore[call-arg]
        except ValidationError as exc:
            errors.append(f"{raw!r}: {exc.errors()[0]['msg']}")
    raise AssertionError(f"no sample value of {variable} validates ({errors}); add one to SAMPLES")


def test_the_readme_documents_the_settings() -> None:
    documented = documented_variables()
    assert len(documented) > 100
    assert {"ORCH_DATA_DIR", "ORCH_EGRESS_MAX_CONNECTIONS", "ORCH_PREVIEW_TTL_S", "ORCH_FD_RESERVE"} <= set(documented)


@pytest.mark.parametrize("variable", documented_variables())
def test_each_documented_variable_sets_its_setting_and_its_sections(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ORCH_"):
            monkeypatch.delenv(name)
    if variable != "ORCH_PREVIEW_LISTEN":  # previews (and their section) exist only with a listener
        monkeypatch.setenv("ORCH_PREVIEW_LISTEN", "127.0.0.1:8711")
    field = variable.removeprefix("ORCH_").lower()
    assert field in Settings.model_fields, f"{variable} is documented but no setting reads it"
    default = Settings.model_fields[field].default
    settings, raw = _sample_settings(variable, monkeypatch)
    value = getattr(settings, field)
    shown = value.get_secret_value() if isinstance(value, SecretStr) else value
    assert shown != default, f"{variable}={raw} left {field} at its default"
    for section in SECTIONS:
        if section is PreviewSettings and settings.preview_listen is None:
            continue
        for name, source in section.sources().items():
            if source == field:
                assert getattr(section.of(settings), name) == value, f"{section.__name__}.{name} is not {variable}"


@pytest.mark.parametrize("section", SECTIONS)
def test_each_section_reads_only_what_settings_has(section: type[Section]) -> None:
    settings = Settings(_env_file=None, data_dir=Path("/srv/orchestrator-data"), preview_listen="127.0.0.1:8710")  # type: ignore[call-arg]
    for source in section.sources().values():
        assert source in Settings.model_fields or isinstance(getattr(Settings, source, None), property), source
    sources = section.sources()
    assert len(set(sources.values())) == len(sources), "two fields of the section read one setting"
    for name, source in sources.items():  # a section names a setting without its package's prefix
        assert source.endswith(name) or (name, source) in RENAMED, f"{section.__name__}.{name} reads {source}"
    built = section.of(settings)
    assert built.model_dump().keys() == section.model_fields.keys()


def test_a_nested_section_is_built_by_its_own_of_and_checked_as_a_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_K8S_NAMESPACE", "sandboxes-two")
    monkeypatch.setenv("ORCH_GREP_TIMEOUT_S", "3")
    settings = Settings(_env_file=None, data_dir=Path("/srv/orchestrator-data"))  # type: ignore[call-arg]
    nested = [(section, name, inner) for section in SECTIONS for name, inner in section.nested().items()]
    assert nested, "no section nests another"
    for section, name, inner in nested:
        assert inner in SECTIONS, f"{inner.__name__} (in {section.__name__}.{name}) is not among SECTIONS: nothing checks it"
        assert name not in section.sources()
        assert getattr(section.of(settings), name) == inner.of(settings)
    sandboxes = SandboxSettings.of(settings)
    assert (sandboxes.kubernetes.namespace, sandboxes.agent.grep_timeout_s) == ("sandboxes-two", 3.0)
