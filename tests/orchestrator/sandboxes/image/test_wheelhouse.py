"""The image's wheelhouse: the agent's lock and the user's workbench may pin one project at
two versions (each installs into its own Python); both wheels must be fetched, by real `pip
download` runs from the package registry."""

from __future__ import annotations

from pathlib import Path

from orchestrator.sandboxes.image.build import ImageBuilder
from orchestrator.sandboxes.image.checkout import BuildSources
from orchestrator.sandboxes.image.recipe import Pin, download_rounds, missing_wheels


def test_no_download_round_names_a_project_twice() -> None:
    pins = [Pin("idna", "3.21"), Pin("anyio", "4.4.0"), Pin("idna", "3.20"), Pin("idna", "3.21")]
    rounds = download_rounds(pins)
    assert rounds == ((Pin("anyio", "4.4.0"), Pin("idna", "3.20")), (Pin("idna", "3.21"),))
    assert download_rounds([]) == ()


def test_the_wheelhouse_holds_both_versions_of_a_project_the_two_pythons_pin(tmp_path: Path) -> None:
    agent, workbench = (Pin("idna", "3.10"),), (Pin("idna", "3.9"),)
    pip = Pin("six", "1.16.0")
    builder = ImageBuilder(None, BuildSources(tmp_path), image="unused")  # type: ignore[arg-type]
    wheelhouse = builder.ensure_wheelhouse(agent, pip, workbench)
    assert missing_wheels((*agent, pip, *workbench), [p.name for p in wheelhouse.iterdir()]) == ()
    assert (wheelhouse / "requirements.txt").read_text().strip() == "idna==3.10"
    assert (wheelhouse / "workbench.txt").read_text().strip() == "idna==3.9"
