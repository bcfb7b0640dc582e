"""Templates as the API sees them: define (and build in the background), inspect, list, delete
(refused while in use), assign to users and groups, and the template a user's sandbox runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import docker

from mounts.layout import GroupRef
from orchestrator.errors import Conflict, Forbidden, InvalidInput, NotFound
from orchestrator.log import kv
from orchestrator.runs.records import RunRecord
from orchestrator.sandboxes.base import SandboxTemplate
from orchestrator.settings import TemplateSettings
from orchestrator.skills.port import RunSkills
from orchestrator.state_store import StateStore
from orchestrator.templates.builder import (
    TemplateBuildFailed,
    build_template_image,
    image_exists,
    image_tag,
    publish,
)
from orchestrator.templates.choice import (
    RunTemplate,
    TemplateChoice,
    TemplateWishes,
    choose_template,
    run_template,
    skill_wish,
)
from orchestrator.templates.recipe import DEFAULT_TEMPLATE, RecipeInvalid, TemplateRecipe, check_name, recipe_hash
from orchestrator.templates.repository import TemplateRecord, TemplateRepository

log = logging.getLogger(__name__)


class TemplateInUse(Conflict):
    code = "template_in_use"


class TemplateNotRequestable(Forbidden):
    code = "template_not_requestable"


# What a call is made for, as far as the template rule cares: (session id, run id).
CallFacts = tuple[str | None, str | None]


class TemplateService:
    def __init__(
        self,
        settings: TemplateSettings,
        store: StateStore,
        *,
        docker_client: Callable[[], docker.DockerClient],
        kubernetes: bool = False,
        skill_needs: Callable[[int, RunSkills], dict[str, str]] = lambda _user_id, _skills: {},
        session_group: Callable[[str], GroupRef | None] = lambda _session_id: None,
    ) -> None:
        """`skill_needs`: the template each skill of a run declares, by skill name;
        `session_group`: the group of a session (None: not a group chat's, or no such session)."""
        self.settings = settings
        self.repo = TemplateRepository(store)
        self._client_factory = docker_client
        self._client: docker.DockerClient | None = None
        self._kubernetes = kubernetes
        self._builds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="template-build")
        self._lock = threading.Lock()
        self._pending: dict[str, Future[None]] = {}
        # Per (user, group, run wish, skill wish), dropped on any change.
        self._effective: dict[tuple[int, str | None, str | None, str | None], tuple[TemplateChoice, SandboxTemplate | None]] = {}
        self._generation = 0  # counts changes: an answer computed across one is not remembered
        self._last: dict[int, tuple[TemplateChoice, SandboxTemplate | None]] = {}  # each user's latest call's
        self._runs: dict[str, RunTemplate] = {}  # the wishes of the runs under way (memory only)
        self._session_groups: dict[str, GroupRef | None] = {}  # a session's group never changes
        self.skill_needs = skill_needs
        self.session_group = session_group
        # A build cut short by a stop (the record still says building) runs again.
        for record in self.repo.all():
            if record.status == "building":
                self._submit(record.name)

    def close(self) -> None:
        self._builds.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()

    def _docker(self) -> docker.DockerClient:
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    # --- definition -----------------------------------------------------------------------
    def put(self, name: str, recipe: TemplateRecipe) -> TemplateRecord:
        try:
            check_name(name)
        except RecipeInvalid as exc:
            raise InvalidInput(str(exc), field=exc.field) from None
        self._check_parent(name, recipe.parent)
        existing = self.repo.get(name)
        if existing is not None and existing.recipe == recipe and existing.status == "building":
            return existing  # the same recipe again: the build under way goes on
        # Otherwise a build: a no-op when the image of this recipe over the current parent
        # exists, a new image when the parent was rebuilt meanwhile.
        self.repo.put_recipe(name, recipe)
        self._changed()
        self._submit(name)
        record = self.repo.get(name)
        assert record is not None
        return record

    def _check_parent(self, name: str, parent: str) -> None:
        seen = {name}
        while parent != DEFAULT_TEMPLATE:
            if parent in seen:
                raise InvalidInput(f"parent {parent!r} would make a cycle of templates", field="parent")
            record = self.repo.get(parent)
            if record is None:
                raise InvalidInput(f"parent template {parent!r} does not exist", field="parent")
            seen.add(parent)
            parent = record.recipe.parent

    def get(self, name: str) -> TemplateRecord:
        record = self.repo.get(name)
        if record is None:
            raise NotFound(f"no template {name!r}")
        return record

    def delete(self, name: str) -> None:
        self.get(name)
        users = self.repo.users_of(name)
        if users:
            raise TemplateInUse(f"template {name!r} is in use ({', '.join(users[:5])}); assign another first",
                                used_by=users[:20])  # fmt: skip
        self.repo.delete(name)
        self.repo.assign(REQUESTABLE, name, None)
        self._changed()

    def wait(self, name: str, timeout: float | None = None) -> None:
        """Until the build under way for `name` ends (the CLI and tests)."""
        with self._lock:
            future = self._pending.get(name)
        if future is not None:
            future.result(timeout)

    # --- building -------------------------------------------------------------------------
    def _submit(self, name: str) -> None:
        with self._lock:
            self._pending[name] = self._builds.submit(self._build, name)

    def _parent_image(self, parent: str) -> str:
        """The parent's image id: the default workbench, or the parent template's serving image."""
        if parent == DEFAULT_TEMPLATE:
            reference = self.settings.sandbox_image
        else:
            record = self.repo.get(parent)
            if record is None or record.image is None:
                raise TemplateBuildFailed(f"the parent template {parent!r} has no built image yet")
            reference = record.image
        try:
            return str(self._docker().images.get(reference).id)
        except docker.errors.ImageNotFound:
            raise TemplateBuildFailed(f"the parent image {reference} is not on this host") from None

    def _build(self, name: str) -> None:
        record = self.repo.get(name)
        if record is None:
            return
        lines: list[str] = []
        recipe = record.recipe
        digest: str | None = None
        try:
            parent_id = self._parent_image(recipe.parent)
            digest = recipe_hash(recipe, parent_id)
            self.repo.note_hash(name, digest)
            tag = image_tag(self.settings.repository, digest)
            if image_exists(self._docker(), tag):
                lines.append(f"== {tag} exists (same recipe over the same parent): nothing to build")
            else:
                build_template_image(
                    self._docker(), recipe, name=name, recipe_hash=digest, parent_image=parent_id, tag=tag,
                    work_dir=self.settings.layout.state_dir / "template-builds" / name,
                    fetch_network=self.settings.fetch_network,
                    ca_bundle=self.settings.egress_ca_bundle if self.settings.egress_ca_bundle.is_file() else None,
                    timeout_s=self.settings.build_timeout_s, log=lines.append,
                )  # fmt: skip
            served = tag
            if self._kubernetes:
                engines = tuple(e.strip() for e in self.settings.k8s_node_engines.split(",") if e.strip())
                served = publish(tag, registry=self.settings.image_registry, node_engines=engines, log=lines.append)
        except (TemplateBuildFailed, docker.errors.DockerException, OSError) as exc:
            log.warning("template build failed %s", kv(template=name, error=str(exc)[:300]))
            self.repo.finish(name, recipe, image=None, recipe_hash=None, log="\n".join(lines), error=str(exc))
            self._changed()
            return
        except Exception as exc:  # a bug must still end the build as failed, never "building" forever
            log.exception("template build crashed %s", kv(template=name))
            self.repo.finish(name, recipe, image=None, recipe_hash=None, log="\n".join(lines), error=f"internal error: {exc}")
            return
        self.repo.finish(name, recipe, image=served, recipe_hash=digest, log="\n".join(lines), error=None)
        self._changed()
        log.info("template ready %s", kv(template=name, image=served))

    # --- who gets which -------------------------------------------------------------------
    def assign_user(self, user_id: int, template: str | None) -> None:
        self._check_assignable(template)
        self.repo.assign("user", str(user_id), None if template == DEFAULT_TEMPLATE else template)
        self._changed()

    def assign_group(self, group: GroupRef, template: str | None) -> None:
        self._check_assignable(template)
        self.repo.assign("group", group_subject(group), None if template == DEFAULT_TEMPLATE else template)
        self._changed()

    def group_template(self, group: GroupRef) -> str:
        return self.repo.assigned("group", group_subject(group)) or DEFAULT_TEMPLATE

    def forget_user(self, user_id: int) -> None:
        """The purge's step: the user's assignment goes (the template itself stays)."""
        self.repo.assign("user", str(user_id), None)
        with self._lock:
            self._last.pop(user_id, None)
        self._changed()

    def set_requestable(self, name: str, requestable: bool) -> None:
        """Whether a bot may ask for `name` when it starts a run (an admin's choice)."""
        self.get(name)
        self.repo.assign(REQUESTABLE, name, name if requestable else None)
        self._changed()

    def requestable(self) -> set[str]:
        return set(self.repo.subjects(REQUESTABLE))

    def check_requestable(self, name: str) -> None:
        """A run's `template`: the default, or one an admin marked requestable; else refused
        (nothing changes)."""
        if name == DEFAULT_TEMPLATE:
            return
        if self.repo.get(name) is None:
            raise NotFound(f"no template {name!r}", field="template")
        if name not in self.requestable():
            raise TemplateNotRequestable(
                f"template {name!r} is not one a bot may ask for; an admin marks it requestable "
                "(PUT /v1/admin/templates/{name} with \"requestable\": true)",
                field="template", template=name,
            )  # fmt: skip

    def _check_assignable(self, template: str | None) -> None:
        if template is None or template == DEFAULT_TEMPLATE:
            return
        if self.repo.get(template) is None:
            raise NotFound(f"no template {template!r}", field="template")

    def ready(self) -> dict[str, TemplateRecord]:
        return {r.name: r for r in self.repo.all() if r.image is not None}

    def choice_for(self, user_id: int, *, run: str | None = None, skill: str | None = None,
                   group: GroupRef | None = None) -> TemplateChoice:  # fmt: skip
        ready = self.ready()
        user = self.repo.assigned("user", str(user_id))
        group_template = self.repo.assigned("group", group_subject(group)) if group else None
        wishes = TemplateWishes(run=run, skill=skill, user=user, group=group_template)
        return choose_template(wishes, ready=ready.keys(), run_allowed=self.requestable())

    # --- runs -----------------------------------------------------------------------------
    def plan_run(self, run: RunRecord, skills: RunSkills, requested: str | None) -> RunTemplate:
        """The run service's port (orchestrator/runs/service.py)."""
        needs = self.skill_needs(run.runtime_user_id, skills)
        return self.start_run(run.run_id, run.runtime_user_id, run.session_id, requested=requested, skill_needs=needs)

    def start_run(self, run_id: str, user_id: int, session_id: str, *, requested: str | None,
                  skill_needs: dict[str, str]) -> RunTemplate:  # fmt: skip
        """The template of a run's calls (the bot's wish, its skills' needs) and what its
        skills lack; remembered until the run ends."""
        group = self._group_of(session_id)
        choice = self.choice_for(user_id, run=requested, skill=skill_wish(skill_needs), group=group)
        plan = run_template(skill_needs, choice, requested=requested)
        with self._lock:
            self._runs[run_id] = plan
        return plan

    def run_of(self, run_id: str) -> RunTemplate | None:
        with self._lock:
            return self._runs.get(run_id)

    def end_run(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def _group_of(self, session_id: str | None) -> GroupRef | None:
        if session_id is None:
            return None
        with self._lock:
            if session_id in self._session_groups:
                return self._session_groups[session_id]
        group = self.session_group(session_id)
        with self._lock:
            if len(self._session_groups) > 10_000:  # a bound, not an eviction policy
                self._session_groups.clear()
            self._session_groups[session_id] = group
        return group

    # --- the router's question, per call ----------------------------------------------------
    def template_of(self, user_id: int, facts: CallFacts | None = None) -> SandboxTemplate | None:
        """The template of the user's sandbox for a call made for (session, run): the group of
        the session, the run's wishes. A call made for nothing (an admin's start, a preview's
        visitor) keeps the template of the user's latest call. Answered from memory until
        something changes."""
        session_id, run_id = facts if facts is not None else (None, None)
        if session_id is None and run_id is None:
            with self._lock:
                last = self._last.get(user_id)
            if last is not None:
                return last[1]
        run = self.run_of(run_id) if run_id is not None else None
        group = self._group_of(session_id)
        key = (user_id, group_subject(group) if group else None, run.requested if run else None,
               run.skill_wish if run else None)  # fmt: skip
        with self._lock:
            known, generation = self._effective.get(key), self._generation
        if known is None:
            choice = self.choice_for(user_id, run=key[2], skill=key[3], group=group)
            known = (choice, self.sandbox_template(choice))
        with self._lock:
            if generation == self._generation:  # else a change came meanwhile: not remembered
                if len(self._effective) > 10_000:  # a bound, not an eviction policy
                    self._effective.clear()
                self._effective[key] = known
                self._last[user_id] = known
        return known[1]

    def effective(self, user_id: int) -> TemplateChoice:
        """What `GET /v1/users/{uid}` shows: the choice of the user's latest call since the
        last change, else the one for a call outside any group session and run."""
        with self._lock:
            last = self._last.get(user_id)
        return last[0] if last is not None else self.choice_for(user_id)

    def _changed(self) -> None:
        with self._lock:
            self._generation += 1
            self._effective.clear()
            self._last.clear()

    def sandbox_template(self, choice: TemplateChoice) -> SandboxTemplate | None:
        """None for the default workbench."""
        if choice.name == DEFAULT_TEMPLATE:
            return None
        record = self.repo.get(choice.name)
        if record is None or record.image is None:
            return None
        return SandboxTemplate(record.name, record.image, record.recipe.env)


REQUESTABLE = "requestable"  # template_assignments kind: a template a bot may ask for (subject = name)


def group_subject(group: GroupRef) -> str:
    return f"{group.channel}/{group.chat_id}"
