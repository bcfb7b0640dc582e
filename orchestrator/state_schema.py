"""The orchestrator's state store schema: every package's own migrations (its `schema.py`) put
together under the store's one version numbering. The order of the packages below is the order
of their parts within one version (version 1 has several), as released: a data dir migrated by
an earlier orchestrator opens unchanged, and a new one gets the same schema."""

from __future__ import annotations

from orchestrator import audit, runtime_overrides
from orchestrator.credentials import schema as credentials
from orchestrator.deliveries import schema as deliveries
from orchestrator.previews import schema as previews
from orchestrator.runs import schema as runs
from orchestrator.sessions import schema as sessions
from orchestrator.state_store import compose_migrations
from orchestrator.templates import schema as templates
from orchestrator.tools import schema as tools
from orchestrator.users import schema as users

STATE_MIGRATIONS: tuple[str, ...] = compose_migrations(
    users.MIGRATIONS,
    sessions.MIGRATIONS,
    runs.MIGRATIONS,
    audit.MIGRATIONS,
    runtime_overrides.MIGRATIONS,
    deliveries.MIGRATIONS,
    tools.MIGRATIONS,
    previews.MIGRATIONS,
    templates.MIGRATIONS,
    credentials.MIGRATIONS,
)
