"""Recipes are checked field by field, hashed by content and turned into a Dockerfile that has
no network step and strips setuid bits."""

from __future__ import annotations

import pytest

from orchestrator.templates.recipe import RecipeInvalid, build_context, check_name, fetch_script, recipe_hash, recipe_of


def test_a_recipe_is_normalized_and_its_hash_covers_the_parent_image() -> None:
    one = recipe_of(name="data", apt=["figlet", "figlet"], pip=["six==1.17.0"], env={"B": "2", "A": "1"})
    two = recipe_of(name="data", parent="default", apt=["figlet"], pip=["six==1.17.0"], env={"A": "1", "B": "2"})
    assert one == two and one.apt == ("figlet",) and one.env == (("A", "1"), ("B", "2"))
    assert recipe_hash(one, "sha256:aa") == recipe_hash(two, "sha256:aa")
    assert recipe_hash(one, "sha256:aa") != recipe_hash(one, "sha256:bb")
    assert recipe_hash(one, "sha256:aa") != recipe_hash(recipe_of(name="data", apt=["figlet"]), "sha256:aa")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({}, "apt"),  # adds nothing
        ({"apt": ["figlet; rm -rf /"]}, "apt"),
        ({"apt": ["-o=APT::Foo"]}, "apt"),
        ({"pip": ["--index-url=http://evil"]}, "pip"),
        ({"pip": ["six @ https://x/six.whl"]}, "pip"),
        ({"npm": ["$(reboot)"]}, "npm"),
        ({"files": {"relative/path": "x"}}, "files"),
        ({"files": {"/etc/../opt/sandbox/venv/bin/python": "x"}}, "files"),
        ({"files": {"/opt/sandbox/venv/x": "x"}}, "files"),
        ({"files": {"/etc/passwd": "root::0:0::/:/bin/sh"}}, "files"),
        ({"files": {"/etc/a b": "x"}}, "files"),  # a space would split the Dockerfile's COPY
        ({"files": {"/etc/$(id)": "x"}}, "files"),
        ({"env": {"PATH": "/evil"}}, "env"),
        ({"env": {"LD_PRELOAD": "/x.so"}}, "env"),
        ({"env": {"A": "two\nlines"}}, "env"),
        ({"env": {"1A": "x"}}, "env"),
        ({"parent": "Not A Name", "apt": ["figlet"]}, "name"),
        ({"parent": "data", "apt": ["figlet"]}, "parent"),  # itself
    ],
)
def test_bad_recipes_name_the_field(fields: dict, field: str) -> None:
    with pytest.raises(RecipeInvalid) as refused:
        recipe_of(name="data", **fields)
    assert refused.value.field == field


@pytest.mark.parametrize("name", ["default", "-x", "UPPER", "a" * 41, "a_b", ""])
def test_names_follow_the_pattern_and_default_is_reserved(name: str) -> None:
    with pytest.raises(RecipeInvalid):
        check_name(name)


def test_the_dockerfile_installs_offline_strips_setuid_and_drops_root() -> None:
    recipe = recipe_of(name="data", apt=["figlet"], pip=["six"], npm=["is-number"],
                       files={"/etc/team.txt": "hello"}, env={"TEAM": "data"})  # fmt: skip
    context = build_context(recipe, parent_image="sha256:parent", name="data", recipe_digest="f" * 64)
    lines = context.dockerfile.splitlines()
    assert lines[0] == "FROM sha256:parent" and lines[-1] == "USER sandbox"
    assert any("apt-get install" in line and "/var/cache/template-debs/*.deb" in line for line in lines)
    assert any("pip install --no-index" in line for line in lines)
    assert any("-perm /6000" in line for line in lines)
    assert context.files == {"files/0": "hello"}
    assert "COPY files/0 /etc/team.txt" in lines
    script = fetch_script(recipe)
    assert "--download-only" in script and "--only-binary=:all:" in script and "--ignore-scripts" in script


def test_a_template_image_is_never_labelled_as_the_default_image() -> None:
    """`build-image` reuses an image by role and recipe label; a FROM passes the parent's on,
    so a template that kept them was once re-tagged as the default image itself."""
    context = build_context(recipe_of(name="data", apt=["figlet"]), parent_image="p", name="data", recipe_digest="d" * 64)
    label = next(line for line in context.dockerfile.splitlines() if line.startswith("LABEL "))
    assert "org.sandbox-orchestrator.role=template" in label and f"org.sandbox-orchestrator.recipe={'d' * 64}" in label
