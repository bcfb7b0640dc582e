"""A tool's published schema says what its validator accepts: arguments inside the schema are
never refused as invalid (schemathesis found `session_search {"query": "\\r"}` refused)."""

from __future__ import annotations

import re
import sys

import pytest
from pydantic import ValidationError

from orchestrator.tools.conversation_tools import SessionSearchArgs

WHITESPACE = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]


@pytest.mark.parametrize("query", [*WHITESPACE, " \t\r\n", "\x1c\x85\u3000"])
def test_a_query_of_only_whitespace_is_outside_the_schema_and_refused(query: str) -> None:
    pattern = SessionSearchArgs.model_json_schema()["properties"]["query"]["pattern"]
    assert re.search(pattern, query) is None
    with pytest.raises(ValidationError):
        SessionSearchArgs(query=query)


@pytest.mark.parametrize("query", ["x", " a ", "\r\nword", "\ufeff", "日本"])
def test_a_query_with_a_word_is_inside_the_schema_and_accepted(query: str) -> None:
    pattern = SessionSearchArgs.model_json_schema()["properties"]["query"]["pattern"]
    assert re.search(pattern, query) is not None
    assert SessionSearchArgs(query=query).query == query.strip()
