"""Which template a user's sandbox runs: one rule, decided from facts the caller gathered.

The most specific wish wins: a template the bot asked for when it started the run (only one
the user may have), then the one the run's skills need, then the admin's choice for the user,
then the one of the group whose session it is, then the default workbench. A wish that names
a template which is not ready is passed over (the sandbox keeps a working image) and named in
`passed_over`, so the run context can say so."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from orchestrator.templates.recipe import DEFAULT_TEMPLATE

SOURCES = ("run", "skill", "user", "group", "default")


@dataclass(frozen=True)
class TemplateWishes:
    run: str | None = None  # asked for by the bot at run start
    skill: str | None = None  # needed by a skill of the run (its manifest)
    user: str | None = None  # set by an admin for this user
    group: str | None = None  # set by an admin for the group of the session


@dataclass(frozen=True)
class TemplateChoice:
    name: str
    source: str  # one of SOURCES
    passed_over: tuple[tuple[str, str, str], ...] = ()  # (source, template, why)


def choose_template(wishes: TemplateWishes, *, ready: Collection[str], run_allowed: Collection[str]) -> TemplateChoice:
    """`ready`: templates with a built image; `run_allowed`: the ones a bot may ask for on
    this user's behalf."""
    passed: list[tuple[str, str, str]] = []
    for source in SOURCES[:-1]:
        name = getattr(wishes, source)
        if name is None:
            continue
        if name == DEFAULT_TEMPLATE:
            return TemplateChoice(DEFAULT_TEMPLATE, source, tuple(passed))
        if source == "run" and name not in run_allowed:
            passed.append((source, name, "not allowed for this user"))
            continue
        if name not in ready:
            passed.append((source, name, "not built (yet)"))
            continue
        return TemplateChoice(name, source, tuple(passed))
    return TemplateChoice(DEFAULT_TEMPLATE, "default", tuple(passed))


@dataclass(frozen=True)
class RunTemplate:
    """A run's template: what its calls run, what the bot asked for, the one skill wish the rule
    weighed, and the skills whose template the sandbox lacks (skill, template, why)."""

    choice: TemplateChoice
    requested: str | None = None
    skill_wish: str | None = None
    lacking: tuple[tuple[str, str, str], ...] = ()


def skill_wish(skill_needs: Mapping[str, str]) -> str | None:
    """Pure: the skill wish of a run: the template of its first skill by name that declares one."""
    return skill_needs[min(skill_needs)] if skill_needs else None


def run_template(skill_needs: Mapping[str, str], choice: TemplateChoice, *, requested: str | None = None) -> RunTemplate:
    """Pure: a run's template once `choice` is made, with each skill whose template is not the
    one chosen and why."""
    ordered = sorted(skill_needs.items())
    wish = skill_wish(skill_needs)
    why_passed = {name: why for source, name, why in choice.passed_over if source == "skill"}
    lacking = []
    for skill, template in ordered:
        if template == choice.name:
            continue
        if template in why_passed:
            why = why_passed[template]
        else:
            why = f"this sandbox runs template {choice.name!r} (chosen by: {choice.source})"
        lacking.append((skill, template, why))
    return RunTemplate(choice, requested, wish, tuple(lacking))
