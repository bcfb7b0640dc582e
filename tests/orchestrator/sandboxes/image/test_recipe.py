"""The image recipe's deciders: pins, wheel matching and the recipe hash, without Docker."""

from __future__ import annotations

import pytest

from orchestrator.sandboxes.image.build import platform_args
from orchestrator.sandboxes.image.recipe import (
    InstalledDistribution,
    Pin,
    RecipeError,
    canonical_name,
    image_recipe,
    lock_requirements,
    lock_text,
    missing_wheels,
    top_level_requirements,
)

ENV = {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux",
       "implementation_name": "cpython", "python_full_version": "3.11.2", "os_name": "posix",
       "platform_machine": "x86_64", "platform_python_implementation": "CPython",
       "platform_release": "", "platform_version": "", "implementation_version": "3.11.2"}  # fmt: skip

INSTALLED = {
    "fastapi": InstalledDistribution("1.0", ("starlette>=0.40", "pydantic>=2", 'httpx; extra == "all"')),
    "starlette": InstalledDistribution("0.41", ("anyio>=3", 'typing-extensions; python_version < "3.10"')),
    "anyio": InstalledDistribution("4.0", ("idna>=2.8", "sniffio")),
    "idna": InstalledDistribution("3.7", ()),
    "sniffio": InstalledDistribution("1.3", ()),
    "pydantic": InstalledDistribution("2.9", ("pydantic-core==2.23", "annotated-types")),
    "pydantic-core": InstalledDistribution("2.23", ()),
    "annotated-types": InstalledDistribution("0.7", ()),
    "httpx": InstalledDistribution("0.27", ()),
    "typing-extensions": InstalledDistribution("4.12", ()),
}


def test_canonical_name_follows_pep_503() -> None:
    assert canonical_name("Typing_Extensions") == "typing-extensions"
    assert canonical_name("zope.interface") == "zope-interface"


def test_top_level_requirements_ignore_comments_and_specifiers() -> None:
    text = "# agent deps\nFastAPI\n\nuvicorn>=0.29  # server\npsutil[test]\n"
    assert top_level_requirements(text) == ("fastapi", "uvicorn", "psutil")


def test_lock_pins_the_closure_at_installed_versions_skipping_extras_and_foreign_markers() -> None:
    pins = lock_requirements(["FastAPI"], INSTALLED, ENV)
    assert lock_text(pins) == (
        "annotated-types==0.7\nanyio==4.0\nfastapi==1.0\nidna==3.7\npydantic==2.9\n"
        "pydantic-core==2.23\nsniffio==1.3\nstarlette==0.41\n"
    )
    names = {pin.name for pin in pins}
    assert "httpx" not in names  # only under an extra
    assert "typing-extensions" not in names  # only for Python < 3.10


def test_lock_refuses_a_dependency_the_host_does_not_have() -> None:
    with pytest.raises(RecipeError, match="'psutil'.*not installed"):
        lock_requirements(["psutil"], INSTALLED, ENV)


def test_wheel_matching_is_exact_on_name_and_version() -> None:
    pydantic = Pin("pydantic", "2.9")
    assert pydantic.matches_wheel("pydantic-2.9-py3-none-any.whl")
    assert not pydantic.matches_wheel("pydantic_core-2.9-cp311-cp311-manylinux_2_17_x86_64.whl")
    assert not pydantic.matches_wheel("pydantic-2.9.1-py3-none-any.whl")
    assert not pydantic.matches_wheel("pydantic-2.9.tar.gz")
    assert Pin("typing-extensions", "4.12").matches_wheel("typing_extensions-4.12-py3-none-any.whl")
    wanted = (pydantic, Pin("idna", "3.7"))
    assert missing_wheels(wanted, ["idna-3.7-py3-none-any.whl", "requirements.txt"]) == (pydantic,)


def test_recipe_changes_with_every_input() -> None:
    base = {"dockerfile": "FROM x", "entrypoint": "#!/bin/sh", "lock": "a==1\n", "base_image_id": "sha256:1"}
    reference = image_recipe(**base)
    assert image_recipe(**base) == reference
    for key in base:
        assert image_recipe(**{**base, key: base[key] + "!"}) != reference, key


def test_platform_args_name_every_manylinux_tag_up_to_bookworms_glibc() -> None:
    args = platform_args("x86_64")
    tags = args[1::2]
    assert set(args[0::2]) == {"--platform"}
    assert "manylinux_2_36_x86_64" in tags and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_37_x86_64" not in tags


def test_pinned_requirements_reads_a_lock_and_refuses_anything_unpinned():
    from orchestrator.sandboxes.image.recipe import RecipeError, pinned_requirements

    text = "# the user's python\nNumPy==2.4.6\n\npandas==3.1.1  # with a comment\n"
    assert [p.requirement for p in pinned_requirements(text)] == ["numpy==2.4.6", "pandas==3.1.1"]
    with pytest.raises(RecipeError):
        pinned_requirements("numpy>=2\n")


def test_the_checkout_s_workbench_lock_is_complete_and_pinned():
    from orchestrator.sandboxes.image.checkout import BuildSources
    from orchestrator.sandboxes.image.recipe import pinned_requirements

    names = {p.name for p in pinned_requirements(BuildSources.from_checkout().workbench_lock.read_text())}
    assert {"numpy", "pandas", "matplotlib", "pillow", "requests", "ipykernel"} <= names
