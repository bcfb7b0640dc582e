"""`build_package` and the path rules it applies (`ids.relative_path`): pure, no disk."""

from __future__ import annotations

import pytest

from mounts import ids
from mounts.skillstore.fingerprint import EntryKind
from mounts.skillstore.package import InvalidPackage, PackageLimits, build_package

LIMITS = PackageLimits(max_files=5, max_file_bytes=100, max_total_bytes=250)


def files(**named: bytes) -> dict[str, tuple[bytes, bool]]:
    return {name: (data, False) for name, data in named.items()}


def test_a_package_implies_its_directories_and_knows_its_manifest() -> None:
    package = build_package(
        "pdf",
        {"SKILL.md": (b"# pdf\n", False), "scripts/lib/run.sh": (b"#!/bin/sh\n", True), "scripts/a": (b"", False)},
        LIMITS,
    )
    assert package.directories == ("scripts", "scripts/lib")
    assert [f.path for f in package.files] == ["SKILL.md", "scripts/a", "scripts/lib/run.sh"]
    by_path = package.manifest.by_path
    assert by_path["scripts"].kind is EntryKind.DIR
    assert by_path["scripts/lib/run.sh"].executable and by_path["scripts/lib/run.sh"].size == 10
    assert package.total_bytes == 16
    # The fingerprint is a function of the content only.
    again = build_package(
        "pdf",
        {"scripts/a": (b"", False), "scripts/lib/run.sh": (b"#!/bin/sh\n", True), "SKILL.md": (b"# pdf\n", False)},
        LIMITS,
    )
    assert again.manifest.fingerprint == package.manifest.fingerprint
    flipped = build_package(
        "pdf",
        {"SKILL.md": (b"# pdf\n", False), "scripts/lib/run.sh": (b"#!/bin/sh\n", False), "scripts/a": (b"", False)},
        LIMITS,
    )
    assert flipped.manifest.fingerprint != package.manifest.fingerprint  # the x bit counts


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a/./b",
        ".",
        "a//b",
        "a/",
        "",
        "a\0b",
        "a\\b",
        "-rf",
        " lead",
        "trail ",
        "tab\there",
        "new\nline",
        "x" * 256,
        "/".join(["d"] * 33),
        "\ud800",
        "bidi\u202eevil",
    ],
)
def test_bad_paths_are_refused_naming_the_field(path: str) -> None:
    with pytest.raises(InvalidPackage) as caught:
        build_package("pdf", {"SKILL.md": (b"x", False), path: (b"y", False)}, LIMITS)
    assert caught.value.field == f"files.{path}"


@pytest.mark.parametrize("path", ["README.md", ".env.example", "docs/使用说明.md", "a b/c.txt", "x" * 255, "v1.2/run-it_now.py"])
def test_ordinary_paths_are_accepted(path: str) -> None:
    package = build_package("pdf", {"SKILL.md": (b"x", False), path: (b"y", False)}, LIMITS)
    assert path in package.manifest.by_path


def test_relative_path_bounds_length_in_bytes() -> None:
    deep = "/".join(["abcdefghij" * 10] * 10)  # 10 components, 1009 bytes: fine
    assert ids.relative_path(deep) == deep
    with pytest.raises(ids.InvalidIdentifier):
        ids.relative_path(deep + "/" + "y" * 20)  # 1030 bytes


def test_skill_md_is_required_at_the_top() -> None:
    with pytest.raises(InvalidPackage) as caught:
        build_package("pdf", files(**{"README.md": b"x"}), LIMITS)
    assert caught.value.field == "files" and "SKILL.md" in caught.value.message
    with pytest.raises(InvalidPackage):
        build_package("pdf", {"docs/SKILL.md": (b"x", False)}, LIMITS)
    with pytest.raises(InvalidPackage) as caught:
        build_package("pdf", {}, LIMITS)
    assert caught.value.field == "files"


def test_a_path_cannot_be_a_file_and_a_directory() -> None:
    with pytest.raises(InvalidPackage) as caught:
        build_package("pdf", {"SKILL.md": (b"x", False), "docs": (b"x", False), "docs/a.md": (b"y", False)}, LIMITS)
    assert caught.value.field == "files.docs"


def test_caps_on_count_single_size_and_total() -> None:
    six = {f"f{i}": (b"", False) for i in range(5)} | {"SKILL.md": (b"x", False)}
    with pytest.raises(InvalidPackage) as caught:
        build_package("pdf", six, LIMITS)
    assert caught.value.field == "files" and "at most 5" in caught.value.message
    with pytest.raises(InvalidPackage) as caught:
        build_package("pdf", {"SKILL.md": (b"x", False), "big": (b"y" * 101, False)}, LIMITS)
    assert caught.value.field == "files.big"
    exactly = build_package("pdf", {"SKILL.md": (b"x" * 50, False), "big": (b"y" * 100, False)}, LIMITS)
    assert exactly.total_bytes == 150
    with pytest.raises(InvalidPackage) as caught:
        build_package("pdf", {"SKILL.md": (b"x" * 100, False), "a": (b"y" * 100, False), "b": (b"z" * 100, False)}, LIMITS)
    assert caught.value.field == "files" and "in total" in caught.value.message


@pytest.mark.parametrize("name", [".hidden", "-x", "a/b", "..", "", "x" * 65, "a b"])
def test_the_skill_name_follows_the_id_rules(name: str) -> None:
    with pytest.raises(InvalidPackage) as caught:
        build_package(name, files(**{"SKILL.md": b"x"}), LIMITS)
    assert caught.value.field == "name"
