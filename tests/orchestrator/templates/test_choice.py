"""The one rule of which template a user's sandbox runs, as a table."""

from __future__ import annotations

import pytest

from orchestrator.templates.choice import TemplateChoice, TemplateWishes, choose_template

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
