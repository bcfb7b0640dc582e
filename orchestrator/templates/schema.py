"""The state store's tables of this package (sandbox templates and their assignments): their
migrations, under the store's one version numbering (orchestrator/state_schema.py puts every
package's together). Append only: a released migration is never edited."""

from __future__ import annotations

from orchestrator.state_store import Migration

MIGRATIONS: tuple[Migration, ...] = (
    # sandbox templates an admin defines and who gets which (docs/templates.md); `image` is the
    # last image that built, kept while a newer recipe fails
    Migration(11, """
    CREATE TABLE templates (
        name          TEXT PRIMARY KEY,
        recipe        TEXT NOT NULL,
        recipe_hash   TEXT,
        status        TEXT NOT NULL,
        image         TEXT,
        image_hash    TEXT,
        log           TEXT NOT NULL DEFAULT '',
        error         TEXT,
        updated_at    TEXT NOT NULL
    );
    CREATE TABLE template_assignments (
        kind          TEXT NOT NULL,
        subject       TEXT NOT NULL,
        template      TEXT NOT NULL,
        updated_at    TEXT NOT NULL,
        PRIMARY KEY (kind, subject)
    );
    CREATE INDEX template_assignments_by_template ON template_assignments (template);
    """),
)
