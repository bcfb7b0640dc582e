"""Templates and who is assigned which, in the state database (migration 11)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from orchestrator.clock import now_iso
from orchestrator.state_store import StateStore
from orchestrator.templates.recipe import TemplateRecipe

LOG_KEEP_CHARS = 16_000  # the tail of a build's log that is kept


@dataclass(frozen=True)
class TemplateRecord:
    name: str
    recipe: TemplateRecipe
    recipe_hash: str | None  # of the latest recipe (None until its parent is known)
    status: str  # building | ready | failed
    image: str | None  # the image that serves: the last one that built
    image_hash: str | None  # the recipe hash of `image`
    log: str
    error: str | None
    updated_at: str


def _record(row: object) -> TemplateRecord:
    return TemplateRecord(
        name=row["name"],  # type: ignore[index]
        recipe=TemplateRecipe.from_json(json.loads(row["recipe"])),  # type: ignore[index]
        recipe_hash=row["recipe_hash"],  # type: ignore[index]
        status=row["status"],  # type: ignore[index]
        image=row["image"],  # type: ignore[index]
        image_hash=row["image_hash"],  # type: ignore[index]
        log=row["log"],  # type: ignore[index]
        error=row["error"],  # type: ignore[index]
        updated_at=row["updated_at"],  # type: ignore[index]
    )


class TemplateRepository:
    def __init__(self, store: StateStore) -> None:
        self._store = store

    def get(self, name: str) -> TemplateRecord | None:
        with self._store.read() as tx:
            row = tx.one("SELECT * FROM templates WHERE name = ?", (name,))
        return _record(row) if row is not None else None

    def all(self) -> list[TemplateRecord]:
        with self._store.read() as tx:
            rows = tx.all("SELECT * FROM templates ORDER BY name")
        return [_record(row) for row in rows]

    def put_recipe(self, name: str, recipe: TemplateRecipe) -> None:
        """A new recipe: building from now on; the image that serves stays."""
        with self._store.write() as tx:
            tx.execute(
                "INSERT INTO templates (name, recipe, status, log, updated_at) VALUES (?, ?, 'building', '', ?) "
                "ON CONFLICT (name) DO UPDATE SET recipe = excluded.recipe, recipe_hash = NULL, "
                "status = 'building', log = '', error = NULL, updated_at = excluded.updated_at",
                (name, json.dumps(recipe.as_json(), sort_keys=True), now_iso()),
            )

    def note_hash(self, name: str, recipe_hash: str) -> None:
        with self._store.write() as tx:
            tx.execute("UPDATE templates SET recipe_hash = ? WHERE name = ?", (recipe_hash, name))

    def finish(self, name: str, recipe: TemplateRecipe, *, image: str | None, recipe_hash: str | None,
               log: str, error: str | None) -> None:  # fmt: skip
        """The end of a build of `recipe` (ignored when the recipe changed meanwhile): ready with
        `image`, or failed with `error` (the serving image kept)."""
        status = "ready" if error is None else "failed"
        with self._store.write() as tx:
            tx.execute(
                "UPDATE templates SET status = ?, log = ?, error = ?, updated_at = ?, "
                "image = COALESCE(?, image), image_hash = CASE WHEN ? IS NULL THEN image_hash ELSE ? END "
                "WHERE name = ? AND recipe = ?",
                (status, log[-LOG_KEEP_CHARS:], error, now_iso(), image, image, recipe_hash, name,
                 json.dumps(recipe.as_json(), sort_keys=True)),
            )  # fmt: skip

    def delete(self, name: str) -> bool:
        with self._store.write() as tx:
            return tx.execute("DELETE FROM templates WHERE name = ?", (name,)).rowcount > 0

    # --- assignments ---------------------------------------------------------------------
    def assign(self, kind: str, subject: str, template: str | None) -> None:
        with self._store.write() as tx:
            if template is None:
                tx.execute("DELETE FROM template_assignments WHERE kind = ? AND subject = ?", (kind, subject))
            else:
                tx.execute(
                    "INSERT INTO template_assignments (kind, subject, template, updated_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (kind, subject) DO UPDATE SET template = excluded.template, "
                    "updated_at = excluded.updated_at",
                    (kind, subject, template, now_iso()),
                )

    def assigned(self, kind: str, subject: str) -> str | None:
        with self._store.read() as tx:
            row = tx.one("SELECT template FROM template_assignments WHERE kind = ? AND subject = ?", (kind, subject))
        return row["template"] if row is not None else None

    def subjects(self, kind: str) -> list[str]:
        with self._store.read() as tx:
            rows = tx.all("SELECT subject FROM template_assignments WHERE kind = ? ORDER BY subject", (kind,))
        return [row["subject"] for row in rows]

    def users_of(self, template: str) -> list[str]:
        """Who is assigned `template` (as `kind:subject`: users and groups), and the templates
        built over it. Its own `requestable` flag is no use of it."""
        with self._store.read() as tx:
            rows = tx.all("SELECT kind, subject FROM template_assignments WHERE template = ? AND kind != 'requestable'",
                          (template,))  # fmt: skip
            children = [r["name"] for r in tx.all("SELECT name, recipe FROM templates")
                        if json.loads(r["recipe"]).get("parent") == template]  # fmt: skip
        return [f"{r['kind']}:{r['subject']}" for r in rows] + [f"template:{c}" for c in children]
