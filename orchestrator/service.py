"""The composition root: builds every part of the orchestrator from its settings, and owns
their start and stop. Nothing else constructs services."""

from __future__ import annotations

import logging
from functools import partial

import docker

from mounts.layout import GroupRef
from mounts.skillstore.install import SkillInstaller
from mounts.skillstore.package import PackageLimits
from orchestrator import metrics
from orchestrator.sandboxes.agent_deploy import AgentDeployment
from orchestrator.sandboxes.base import SandboxBackend
from orchestrator.sandboxes.lifecycle_decision import reap_interval_s
from orchestrator.sandboxes.choice import detect_backend
from orchestrator.sandboxes.docker import DockerBackend
from orchestrator.sandboxes.kernel_boundary import kernel_boundaries
from orchestrator.sandboxes.uid_blocks import UidBlock
from orchestrator.templates.service import TemplateService
from orchestrator.sandboxes.process import ProcessBackend
from orchestrator.sessions.chat_store import ChatStore
from orchestrator.call_ledger import CallLedger
from orchestrator.collaboration.coordinator import CollaborationService
from orchestrator.collaboration.policy import CollaborationLimits
from orchestrator.collaboration.store import open_mailbox
from orchestrator.collaboration.tools import register_collaboration_tools
from orchestrator.deliveries.outbox import DeliveryStore
from orchestrator.descriptors.budget import DescriptorBudget, plan_for
from orchestrator.descriptors.process_limit import descriptor_limit
from orchestrator.credentials.injection import CredentialInjection
from orchestrator.credentials.startup import open_credentials
from orchestrator.egress import rules as egress_rules
from orchestrator.egress.service import EgressService
from orchestrator.file_watch import FileWatcher
from orchestrator.users.group_gids import GroupGids
from orchestrator.users.incoming import IncomingFiles
from orchestrator.runs.identity_switch import RuntimeIdentitySwitch
from orchestrator.runs.idle_runs import IdleRunSweeper, sweep_interval_s
from orchestrator import data_dir_lock
from orchestrator.log import kv
from orchestrator.periodic import PeriodicTask
from orchestrator.previews.service import PreviewService
from orchestrator.previews.tools import register_preview_tools
from orchestrator.quotas.host_copies import HostCopies, how_to_free
from orchestrator.quotas.model import MIB, QuotaMechanism
from orchestrator.quotas.service import DiskQuotas
from orchestrator.sessions.projects import ProjectRepository
from orchestrator.runs.prompt_identity import DelegatedCredential
from orchestrator.runs.records import RunRecord, RunRepository, RunStatus
from orchestrator.runs.service import RunService
from orchestrator.sandboxes.router import SandboxRouter
from orchestrator.sessions.cleanup import CleanupPhase, CleanupStep, stop_calls
from orchestrator.sessions.upkeep import SessionUpkeep
from orchestrator.sessions.records import SessionRepository
from orchestrator.sessions.service import SessionService
from orchestrator.settings import (
    CallSettings,
    CollaborationSettings,
    CredentialSettings,
    DescriptorSettings,
    DiskQuotaSettings,
    EgressSettings,
    HostToolSettings,
    IdentitySettings,
    PreviewSettings,
    SandboxSettings,
    Settings,
    TemplateSettings,
)
from orchestrator.skills.admin import SkillAdmin
from orchestrator.skills.service import SkillService
from orchestrator.startup_checks import check_data_dir_location, check_state_present
from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import StateStore
from orchestrator.system_status import SystemStatus
from orchestrator.tools.container_tools import register_container_tools
from orchestrator.tools.conversation_tools import register_conversation_tools
from orchestrator.tools.byte_sources import BytesResolver
from orchestrator.tools.call_records import CallRecords, repeat_wait_s
from orchestrator.tools.dispatch import ToolDispatcher
from orchestrator.deliveries.public_uploads import PublishedUploads
from orchestrator.tools.host_tools import HostTools, register_host_tools
from orchestrator.tools.registry import ToolRegistry
from orchestrator.users.dirs import UserDirectories, sandbox_uid
from orchestrator.deliveries.url_fetch import UrlFetcher
from orchestrator.users.identities import IdentityRepository
from orchestrator.users.listing import UserListing
from orchestrator.users.purge import PurgeStep, UserPurge
from orchestrator.users.repository import UserRepository
from orchestrator.users.resources import Maxima, ResourceOverrides, Resources
from orchestrator.users.sandbox_control import SandboxControl
from orchestrator.sandboxes import uid_registry
from orchestrator.sandboxes.docker_spec import instance_id

log = logging.getLogger(__name__)


def build_skill_service(settings: Settings, directories: UserDirectories | None = None) -> SkillService:
    """The skill provider; also what `orchestrator gc` uses without starting a server."""
    return SkillService(settings.layout, directories)


class OrchestratorService:
    def __init__(self, settings: Settings, *, exclusive: bool = False) -> None:
        """`exclusive` (what `orchestrator serve` asks for): refuse to start while another server
        holds this data dir, and hold it until close() (orchestrator/data_dir_lock.py)."""
        self.settings = settings
        self.layout = settings.layout
        check_data_dir_location(settings.data_dir, sandbox_ids=settings.sandbox_id_ranges)
        self.data_dir_lock = data_dir_lock.acquire(self.layout) if exclusive else None
        try:
            self._start_checked(settings)
        except BaseException:
            self._release_data_dir()
            raise

    def _start_checked(self, settings: Settings) -> None:
        check_state_present(self.layout)
        # Held until close(): no other live orchestrator on this host may use our sandbox uids.
        self.uid_block = uid_registry.register(
            settings.uid_registry_dir,
            instance_id=instance_id(self.layout.root),
            data_dir=self.layout.root,
            base=settings.sandbox_uid_base,
            max_user_id=settings.max_user_id,
        )
        try:
            self._build(settings)
        except BaseException:
            if self.uid_block is not None:
                self.uid_block.release()
            raise

    def _build(self, settings: Settings) -> None:
        # First: a budget that does not fit the process's limit refuses the start (BudgetSettingsError).
        self.descriptors = DescriptorBudget(plan_for(descriptor_limit(), DescriptorSettings.of(settings)))
        log.info("descriptor budget %s", kv(**self.descriptors.plan.as_json()))
        if settings.http_limit_concurrency > self.descriptors.plan.reserve:
            log.warning(
                "the API may hold more connections than the descriptor reserve keeps %s",
                kv(http_limit_concurrency=settings.http_limit_concurrency, reserve=self.descriptors.plan.reserve,
                   hint="raise the hard limit, ORCH_FD_RESERVE, or lower ORCH_HTTP_LIMIT_CONCURRENCY"),
            )  # fmt: skip
        self.store = StateStore(self.layout.state_db, STATE_MIGRATIONS)
        self.store.open()
        # A wrong or missing key refuses the start (CredentialsKeyRefused, a StartupRefused).
        self.credentials, self.credential_ca = open_credentials(CredentialSettings.of(settings), self.store)
        self.users = UserRepository(self.store, max_user_id=settings.max_user_id)
        self.identities = IdentityRepository(self.store, self.users)
        self.projects = ProjectRepository(self.store)
        self.session_repo = SessionRepository(self.store)
        self.chat = ChatStore(self.layout, transcript_turns=settings.transcript_turns)
        self.run_repo = RunRepository(self.store)
        self.switch = RuntimeIdentitySwitch(self.store, IdentitySettings.of(settings))
        self.disk_quotas = DiskQuotas(
            DiskQuotaSettings.of(settings),
            sandbox_uid=partial(sandbox_uid, uid_base=settings.sandbox_uid_base, max_user_id=settings.max_user_id),
            stop_sandbox=self._stop_sandbox_of,  # over quota (scan), an offline grow (loop)
        )
        self.disk_quotas.start()  # before any sandbox or host write: images adopted or mounted
        quotas_on = self.disk_quotas.mechanism is not QuotaMechanism.OFF
        self.directories = UserDirectories(
            self.layout, settings.sandbox_uid_base, settings.max_user_id,
            volumes=self.disk_quotas,
            **({"credential_env": self.credentials.placeholder_env} if self.credentials is not None else {}),
        )  # fmt: skip
        self.skills = build_skill_service(settings, self.directories)
        self.skill_admin = SkillAdmin(
            self.skills,
            SkillInstaller(self.layout, prepare_user_dir=self.directories.ensure_userskills_dir),
            self.store,
            PackageLimits(
                max_files=settings.skill_upload_max_files,
                max_file_bytes=settings.skill_upload_max_file_bytes,
                max_total_bytes=settings.skill_upload_max_bytes,
            ),
        )
        self.agent_deployment = AgentDeployment(self.layout)
        sandbox_settings = SandboxSettings.of(settings)
        backends: dict[str, SandboxBackend] = {
            "process": ProcessBackend(sandbox_settings, self.directories, self.agent_deployment)
        }
        self.backend_choice = detect_backend(sandbox_settings)
        if self.backend_choice.docker:
            backends["docker"] = DockerBackend(
                sandbox_settings,
                self.directories,
                self.agent_deployment,
                known_user=lambda user_id: self.users.get(user_id) is not None,
            )
        if self.backend_choice.kubernetes:
            from orchestrator.sandboxes.kubernetes import KubernetesBackend

            backends["kubernetes"] = KubernetesBackend(
                sandbox_settings,
                self.directories,
                self.agent_deployment,
                known_user=lambda user_id: self.users.get(user_id) is not None,
            )
        log.info("sandbox backend %s", kv(default=self.backend_choice.default, reason=self.backend_choice.reason))
        self.group_gids = GroupGids(self.store, settings.group_gid_range, groups_root=self.layout.groups_root)
        # Every call in flight, counted once (per run, user, routed run/session, sandbox).
        self.call_ledger = CallLedger(user_max_calls=settings.user_max_concurrent_calls)
        # The admin's hand on users (docs/admin-console.md): CPU and memory overrides.
        self.resources = ResourceOverrides(
            self.store,
            default=Resources(settings.sandbox_cpus, settings.sandbox_memory_mb),
            maxima=Maxima(settings.user_max_cpus, settings.user_max_memory_mb),
        )
        self.templates = TemplateService(
            TemplateSettings.of(settings), self.store, docker_client=lambda: docker.from_env(timeout=120),
            kubernetes=self.backend_choice.kubernetes,
            skill_needs=self.skills.templates_needed,
            session_group=self._group_of_session,
        )  # fmt: skip
        self.egress: EgressService | None = None
        if settings.egress != "off":
            docker_backend = backends.get("docker")
            injection = None
            if self.credentials is not None and self.credential_ca is not None:
                injection = CredentialInjection(
                    self.credentials, self.credential_ca, settings.upstream_ca_bundle, self.call_ledger.sessions_of
                )
            self.egress = EgressService(
                EgressSettings.of(settings), self.directories, self.store, self.descriptors,
                peer_container=docker_backend.peer_container if isinstance(docker_backend, DockerBackend) else lambda _: None,
                credentials=injection,
            )  # fmt: skip
        call_settings = CallSettings.of(settings)  # the router's and a repeat's wait
        self.sandboxes = SandboxRouter(
            call_settings,
            self.layout, self.users, self.group_gids, backends, self.backend_choice.default,
            process_sandbox=sandbox_settings.process_sandbox, ledger=self.call_ledger,
            # over quota (scan), over a share of a shared place
            call_guards=[self.disk_quotas.refuse_write] if quotas_on else [],
            call_hooks=[self.egress.before_call] if self.egress is not None else [],
            explain_no_space=self.disk_quotas.explain_no_space if quotas_on else None,
            resources_of=self.resources.override_of,
            template_of=self.templates.template_of,
        )  # fmt: skip
        self.mailbox = open_mailbox(self.layout.collaboration_db)
        self.collaboration = CollaborationService(
            mailbox=self.mailbox,
            state=self.store,
            end_run=self._cancel_run,
            limits=CollaborationLimits.from_settings(CollaborationSettings.of(settings)),
        )
        self.runs = RunService(
            layout=self.layout,
            public_base_url=settings.public_base_url,
            store=self.store,
            sessions=self.session_repo,
            users=self.users,
            runs=self.run_repo,
            switch=self.switch,
            directories=self.directories,
            skills=self.skills,
            templates=self.templates,
            start_guards=[self.collaboration.run_starting],
            start_listeners=[self.collaboration.run_started],
            # Ending a run kills its calls in flight (whole process trees).
            end_listeners=[
                self._stop_calls_of_run,
                lambda run: self.templates.end_run(run.run_id),
                self.collaboration.run_ended,
            ],
            **({"delegated_to": self._delegated_to} if self.credentials is not None else {}),
        )
        self.collaboration.recover()  # an uncertain start after a restart is marked, never replayed
        # Host-side copies of what a sandbox produced, charged to its user (docs/disk-quotas.md).
        self.host_copies = HostCopies(
            budget_bytes=settings.user_host_copies_mb * MIB,
            watermark=self.disk_quotas.watermark_refusal,
            how_to_free=self._how_to_free_host_copies,
        )
        self.deliveries = DeliveryStore(self.store, self.layout, ttl_s=settings.delivery_ttl_s, copies=self.host_copies)
        self.sessions = SessionService(
            self.store, self.session_repo, self.users, chat=self.chat, layout=self.layout,
            cleanup_steps=[
                CleanupStep("runs", CleanupPhase.STOP, self.runs.cancel_running_of_deleted),
                # Deleting a session kills its calls in flight (whole process trees).
                CleanupStep("calls", CleanupPhase.STOP, stop_calls(self._stop_calls_of_session)),
                CleanupStep("collaboration", CleanupPhase.REMOVE,
                            lambda deleted: self.collaboration.forget_session(deleted.session_id)),
                CleanupStep("deliveries", CleanupPhase.REMOVE, self.deliveries.forget_session),
            ],
        )  # fmt: skip
        self.session_upkeep = SessionUpkeep(self.sessions, self.chat)
        self.tools = ToolRegistry()
        register_conversation_tools(
            self.tools, self.store, self.session_repo, self.projects, self.chat,
            read_max_chars=settings.conversation_read_max_chars,
        )  # fmt: skip
        register_container_tools(self.tools)
        register_collaboration_tools(self.tools, self.collaboration)
        self.url_fetcher = UrlFetcher(
            timeout_s=settings.url_fetch_timeout_s, allow_loopback=settings.url_fetch_allow_loopback
        )
        self.uploads = PublishedUploads(self.store, self.layout, self.directories)
        self.incoming = IncomingFiles(self.layout, self.directories, self.group_gids, settings.upload_max_bytes)
        host_tools = HostTools(
            settings=HostToolSettings.of(settings),
            layout=self.layout,
            directories=self.directories,
            resolver=BytesResolver(
                layout=self.layout,
                uploads=self.uploads,
                public_base_url=settings.public_base_url,
                sandboxes=self.sandboxes,
                fetcher=self.url_fetcher,
            ),
            deliveries=self.deliveries,
            sessions=self.sessions,
            uploads=self.uploads,
            copies=self.host_copies,
        )
        register_host_tools(self.tools, host_tools)
        self.previews: PreviewService | None = None
        if settings.preview_listen is not None:  # docs/previews.md
            self.previews = PreviewService(PreviewSettings.of(settings), self.store, self.sandboxes, self.descriptors)
            register_preview_tools(self.tools, self.previews)
        self.dispatcher = ToolDispatcher(
            layout=self.layout,
            store=self.store,
            registry=self.tools,
            runs=self.run_repo,
            sessions=self.session_repo,
            sandboxes=self.sandboxes,
            ledger=self.call_ledger,
            call_records=CallRecords(
                ttl_s=settings.tool_call_result_ttl_s,
                max_result_bytes=settings.tool_call_result_max_bytes,
                copies=self.host_copies,
            ),
            repeat_wait_s=partial(repeat_wait_s, call_settings),
            transfers=host_tools.transfers,  # a large read_bytes takes a slot like send_file
        )
        with self.store.read() as tx:  # the counters start from what is on disk: one query each
            recorded = CallRecords.charged_usage(tx)
        self.host_copies.rebuild({**self.deliveries.charged_usage(), **recorded})
        # The scrape-time gauges of /metrics read what this service keeps (docs/operations.md).
        metrics.register_sources(
            states=lambda: [(s.backend, s.state) for s in self.sandboxes.status()],
            in_flight=self.call_ledger.per_user,
            top_n=settings.metrics_top_users,
        )
        metrics.register_disk_usage(self._volume_usage if quotas_on else None)
        # The admin's hand on users (docs/admin-console.md): sandboxes and purges.
        self.sandbox_control = SandboxControl(self.store, self.sandboxes)
        purge_steps: dict[str, PurgeStep] = {
            "resources": lambda user_id, _actor: self.resources.forget(user_id),
            "template": lambda user_id, _actor: self.templates.forget_user(user_id),
        }
        if (egress := self.egress) is not None:
            purge_steps["egress_rules"] = lambda user_id, _actor: egress.rules.forget(user_id)
        if (credentials := self.credentials) is not None:
            purge_steps["credentials"] = lambda user_id, actor: credentials.purge_user(user_id, actor=actor)
        if (previews := self.previews) is not None:
            purge_steps["previews"] = lambda user_id, actor: previews.revoke_all_of_user(user_id, actor=actor)
        self.purge = UserPurge(
            store=self.store,
            purged=self.users.purged,
            layout=self.layout,
            stop_sandbox=self._stop_sandbox_of,
            remove_volume=self.disk_quotas.remove_user_volume,
            delete_session=lambda session_id, actor: self.sessions.delete(session_id, actor=actor),
            steps=purge_steps,
            tombstone_steps=[PublishedUploads.forget_user_in, egress_rules.forget_in],
        )
        self.user_listing = UserListing(
            self.store, self.users, self.identities, self.sandboxes, self.sandbox_control,
            last_call_at=self.run_repo.last_activity_of_user,
        )  # fmt: skip
        # What /healthz and the console's overview show of the host.
        self.status = SystemStatus(
            sandbox_network=settings.sandbox_network,
            uid_block=UidBlock.of(settings.sandbox_uid_base, settings.max_user_id),
            kernel_boundary=kernel_boundaries(sandbox_settings, backends),
            switch=self.switch,
            backends=self.sandboxes.backends,
            default_backend=self.backend_choice.default,
            backend_reason=self.backend_choice.reason,
            disk_quotas=self.disk_quotas,
            egress=self.egress,
            descriptors=self.descriptors,
        )
        self.idle_runs = IdleRunSweeper(
            repo=self.run_repo, runs=self.runs, ledger=self.call_ledger, max_idle_s=settings.run_max_idle_s
        )
        self._watchers: list[FileWatcher] = []
        self._tasks: list[PeriodicTask] = []
        self.skills_watcher: FileWatcher | None = None

    def _how_to_free_host_copies(self, user_id: int) -> str:
        return how_to_free(self.deliveries.next_expiry(user_id), self.settings.tool_call_result_ttl_s)

    def _cancel_run(self, run_id: str) -> None:
        self.runs.end(run_id, RunStatus.CANCELLED, actor="collaboration")

    def _delegated_to(self, user_id: int, session_id: str) -> tuple[DelegatedCredential, ...]:
        assert self.credentials is not None
        return self.credentials.delegated_to(user_id, session_id, self._display_name)

    def _display_name(self, user_id: int) -> str | None:
        record = self.users.get(user_id)
        return record.display_name if record is not None else None

    def _stop_sandbox_of(self, user_id: int) -> None:
        for backend in self.sandboxes.backends.values():
            backend.stop(user_id)

    def _volume_usage(self) -> list[metrics.VolumeUsage]:
        return [
            metrics.VolumeUsage(u.volume, u.bytes_used, u.bytes_limit, u.inodes_used, u.inodes_limit)
            for u in self.disk_quotas.all_usage()
        ]

    def _group_of_session(self, session_id: str) -> GroupRef | None:
        record = self.session_repo.get(session_id)
        return record.group if record is not None else None

    def _stop_calls_of_run(self, run: RunRecord) -> None:
        # Its runtime user's sandbox runs its container tools; any other that has one in flight too.
        for user_id in {run.runtime_user_id, *self.call_ledger.users_of(run.run_id, None)}:
            self.sandboxes.cancel_calls(user_id, run_id=run.run_id)

    def _stop_calls_of_session(self, user_id: int, session_id: str) -> None:
        for user in {user_id, *self.call_ledger.users_of(None, session_id)}:
            self.sandboxes.cancel_calls(user, session_id=session_id)

    def start(self) -> None:
        """Background work: the settings-file watcher (identity mode), session storage upkeep,
        each backend's idle-sandbox reaper, the skill-source watcher, the periodic skill-store GC, the
        sweep of expired deliveries and the one of runs whose bot went away."""
        self.session_upkeep.start()
        if self.previews is not None:
            self.previews.start()
        for backend in self.sandboxes.backends.values():
            # At once first: the docker backend's first round adopts the containers of the
            # last run (and removes those of users this orchestrator does not know).
            self._schedule(
                PeriodicTask(
                    f"reap-idle-{backend.name}",
                    reap_interval_s(self.settings.idle_timeout_s, self.settings.pause_after_s),
                    backend.reap_idle,
                    first_delay_s=0.0,
                )
            )
        settings_file = self.settings.settings_file
        if settings_file is not None:
            path = settings_file.resolve()
            watcher = FileWatcher(
                "settings-file",
                [path.parent],
                lambda _paths: self.switch.reload_settings_file(),
                only=[path],
            )
            watcher.start()
            self._watchers.append(watcher)
            log.info("watching the settings file %s", kv(file=path))
        self.skills.protect_personal_sources()
        # Hot updates: a change under skills/ or userskills/ re-hashes what it touched.
        # Not waited for: sources are hashed at first use, normally long after the watch is up.
        self.skills_watcher = FileWatcher(
            "skills", self.skills.watched_dirs, self.skills.on_source_change, resolve=False
        )
        self.skills_watcher.start(wait=False)
        self._watchers.append(self.skills_watcher)
        if self.settings.skill_gc_interval_s > 0:
            gc = PeriodicTask(
                "skill-gc",
                self.settings.skill_gc_interval_s,
                lambda: self.skills.collect_garbage(max_age_days=self.settings.skill_gc_days),
            )
            self._schedule(gc)
        if self.settings.delivery_sweep_interval_s > 0:
            sweep = PeriodicTask("delivery-sweep", self.settings.delivery_sweep_interval_s, self.deliveries.sweep)
            self._schedule(sweep)
        if self.disk_quotas.mechanism is QuotaMechanism.SCAN:
            self._schedule(PeriodicTask("disk-scan", self.settings.disk_scan_interval_s, self.disk_quotas.scan_round))
        if self.disk_quotas.mechanism is not QuotaMechanism.OFF:
            shared = PeriodicTask("shared-disk-scan", self.settings.disk_scan_interval_s, self.disk_quotas.shared_round)
            self._schedule(shared)
        if self.settings.run_max_idle_s > 0:
            idle = PeriodicTask("idle-runs", sweep_interval_s(self.settings.run_max_idle_s), self.idle_runs.sweep)
            self._schedule(idle)

    def _schedule(self, task: PeriodicTask) -> None:
        task.start()
        self._tasks.append(task)

    def close(self) -> None:
        self.session_upkeep.stop()
        for task in self._tasks:
            task.stop()
        self._tasks.clear()
        for watcher in self._watchers:
            watcher.stop()
        self._watchers.clear()
        if self.previews is not None:
            self.previews.close()
        self.sandboxes.close()
        self.templates.close()
        self.disk_quotas.close()
        if self.egress is not None:
            self.egress.close()
        self.dispatcher.close()
        self.mailbox.close()
        self.store.close()
        if self.uid_block is not None:
            self.uid_block.release()
            self.uid_block = None
        self._release_data_dir()

    def _release_data_dir(self) -> None:
        if self.data_dir_lock is not None:
            self.data_dir_lock.release()
            self.data_dir_lock = None
