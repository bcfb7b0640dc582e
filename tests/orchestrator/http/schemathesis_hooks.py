"""A schemathesis check for tool calls (loaded through SCHEMATHESIS_HOOKS by
test_schemathesis.py). A tool refuses bad arguments as a tool-level result, HTTP 200 with
`{"ok": false, "error": {"code": "invalid_arguments"}}`, which schemathesis' own status-based
checks cannot tell from success. This one can:

- arguments that break the tool's schema must come back as invalid_arguments (or a 422 when
  the body is not a tool call at all);
- arguments that fit the schema must never come back as invalid_arguments: the schema a model
  receives states every rule the tool enforces.
"""

from __future__ import annotations

import re

import schemathesis

from sandbox_agent.wire import TOOL_PATH_MAX


def _invalid_arguments(response) -> dict | None:
    if response.status_code != 200:
        return None
    body = response.json()
    error = body.get("error") if isinstance(body, dict) and body.get("ok") is False else None
    return error if isinstance(error, dict) and error.get("code") == "invalid_arguments" else None


@schemathesis.check
def tool_arguments_contract(ctx, response, case):
    if "/tools/" not in case.path or case.meta is None:
        return None
    refused = _invalid_arguments(response)
    if case.meta.generation.mode.is_negative:
        if response.status_code == 200 and refused is None and _breaks_schema(case):
            raise AssertionError(f"arguments outside the tool's schema were not refused: {response.text[:500]}")
    elif refused is not None and not _beyond_byte_limits(case.body) and not _not_a_python_regex(case):
        raise AssertionError(f"arguments inside the tool's schema were refused: {refused}")
    return None


def _not_a_python_regex(case) -> bool:
    """grep_search's pattern is `format: regex`; JSON Schema's regex dialect is ECMA-262's and a
    generator may produce text Python's `re` refuses, which grep_search rightly refuses too."""
    if not case.path.endswith("/grep_search") or not isinstance(case.body, dict):
        return False
    pattern = (case.body.get("arguments") or {}).get("pattern")
    try:
        re.compile(pattern)
    except (re.error, TypeError):
        return True
    return False


def _beyond_byte_limits(body: object) -> bool:
    """Whether a path argument is within the schema's character counts but beyond the agent's
    byte limits (a name over NAME_MAX, a path over TOOL_PATH_MAX bytes): JSON Schema counts
    characters, so non-ASCII text can be schema-valid and still too long (docs/api.md)."""
    arguments = body.get("arguments") if isinstance(body, dict) else None
    if not isinstance(arguments, dict):
        return False
    for key in ("path", "path_or_url", "cwd"):  # cwd: process_start's working directory
        value = arguments.get(key)
        if isinstance(value, str) and not value.isascii():
            raw = value.encode("utf-8", "surrogatepass")
            if len(raw) > TOOL_PATH_MAX - 512 or any(len(part) > 255 for part in raw.split(b"/")):
                return True
    return False


def _breaks_schema(case) -> bool:
    """Whether the body really breaks the schema after JSON serialization (schemathesis may
    mutate into a value that serializes back to a valid one)."""
    import jsonschema_rs

    schema = case.operation.definition.raw["requestBody"]["content"]["application/json"]["schema"]
    components = case.operation.schema.raw_schema.get("components", {})
    try:
        validator = jsonschema_rs.validator_for({**schema, "components": components})
    except Exception:  # noqa: BLE001 - an unusable schema is not this check's business
        return False
    return not validator.is_valid(case.body)
