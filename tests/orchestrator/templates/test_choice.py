"""The one rule of which template a user's sandbox runs, as a table."""

from __future__ import annotations

import pytest

from orchestrator.templates.choice import TemplateChoice, TemplateWishes, choose_template, run_template

READY = {"data", "web", "ml"}

CASES = [
    # wishes, run_allowed, expected (name, source), passed over
    (TemplateWishes(), set(), ("default", "default"), ()),
    (TemplateWishes(user="data"), set(), ("data", "user"), ()),
    (TemplateWishes(group="web"), set(), ("web", "group"), ()),
    (TemplateWishes(user="data", group="web"), set(), ("data", "user"), ()),
    (TemplateWishes(skill="ml", user="data", group="web"), set(), ("ml", "skill"), ()),
    (TemplateWishes(run="web", skill="ml", user="data"), {"web"}, ("web", "run"), ()),
    # a run may ask only for a template the user may have
    (TemplateWishes(run="web", user="data"), {"data"}, ("data", "user"), (("run", "web", "not allowed for this user"),)),
    # a template without a built image is passed over: the sandbox keeps a working image
    (TemplateWishes(user="new"), set(), ("default", "default"), (("user", "new", "not built (yet)"),)),
    (TemplateWishes(skill="new", group="web"), set(), ("web", "group"), (("skill", "new", "not built (yet)"),)),
    # the default named on purpose stops the search where it is named
    (TemplateWishes(user="default", group="web"), set(), ("default", "user"), ()),
]


@pytest.mark.parametrize(("wishes", "allowed", "expected", "passed"), CASES)
def test_choose_template(wishes: TemplateWishes, allowed: set[str], expected: tuple[str, str], passed: tuple) -> None:
    choice = choose_template(wishes, ready=READY, run_allowed=allowed)
    assert choice == TemplateChoice(expected[0], expected[1], passed)


RUN_CASES = [
    # skill needs, choice, requested -> the skill wish weighed, what the skills lack
    ({}, TemplateChoice("default", "default"), None, None, ()),
    # the first skill by name that declares a template is the wish the rule weighs
    ({"viz": "web", "etl": "data"}, TemplateChoice("data", "skill"), None, "data",
     (("viz", "web", "this sandbox runs template 'data' (chosen by: skill)"),)),
    # a wish passed over says why
    ({"etl": "new"}, TemplateChoice("data", "user", (("skill", "new", "not built (yet)"),)), None, "new",
     (("etl", "new", "not built (yet)"),)),
    # the bot's wish beats the skill's: the skill says what it lacks
    ({"etl": "data"}, TemplateChoice("web", "run"), "web", "data",
     (("etl", "data", "this sandbox runs template 'web' (chosen by: run)"),)),
    # a skill whose template runs lacks nothing
    ({"etl": "data", "load": "data"}, TemplateChoice("data", "skill"), None, "data", ()),
]


@pytest.mark.parametrize(("needs", "choice", "requested", "wish", "lacking"), RUN_CASES)
def test_run_template(needs: dict, choice: TemplateChoice, requested: str | None, wish: str | None, lacking: tuple) -> None:
    plan = run_template(needs, choice, requested=requested)
    assert (plan.choice, plan.requested, plan.skill_wish, plan.lacking) == (choice, requested, wish, lacking)
