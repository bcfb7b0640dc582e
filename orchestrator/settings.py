"""Service settings: environment variables prefixed `ORCH_`, plus an optional
dotenv-style settings file named by `ORCH_SETTINGS_FILE` (the environment wins over the file)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mounts.ids import MAX_USER_ID
from mounts.layout import DataLayout
from orchestrator.egress.policy import DEFAULT_ALLOW as DEFAULT_EGRESS_ALLOW, parse_patterns, split_allow_setting
from orchestrator.egress.resolver import parse_dns_servers
from orchestrator.identity import DEFAULT_IDENTITY_MODE, IdentityMode, parse_identity_mode
from orchestrator.users.group_gids import GidRange
from orchestrator.startup_checks import IdRange

# Ids stay in 31 bits: some tools (and signed 32-bit fields) mishandle larger ones.
MAX_ID = 2**31 - 2
EXT4_INODE_BYTES = 256  # mkfs.ext4's default inode size (the images of orchestrator/quotas/)


class K8sToleration(BaseModel):
    """One toleration of the sandbox pods (a node tainted for sandboxes takes only them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = Field(None, pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    def manifest(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ORCH_", extra="ignore", frozen=True)

    data_dir: Path = Field(Path("./data"), description="Root of the data layout (mounts/layout.py).")
    public_base_url: str = Field(
        "http://127.0.0.1:8700", description="Origin used to build public /uploads/ URLs."
    )
    api_token: SecretStr | None = Field(None, description="Bearer token for chat bots.")
    admin_token: SecretStr | None = Field(None, description="Bearer token for /v1/admin/*.")
    runtime_identity: str = Field(
        DEFAULT_IDENTITY_MODE.value,
        description="`execution` or `owner`; an invalid value falls back to `execution`.",
    )
    backend: Literal["auto", "docker", "process", "kubernetes"] = Field(
        "auto",
        description="Sandbox backend: docker when an engine and the image exist, else process; `kubernetes` "
        "(never chosen by auto): one pod per user on a cluster (docs/kubernetes.md).",
    )
    k8s_namespace: str = Field(
        "sandbox-orchestrator",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="Namespace of the kubernetes backend's sandbox pods (it must exist).",
    )
    k8s_kubeconfig: Path | None = Field(
        None,
        description="Kubeconfig of the kubernetes backend; unset: the pod's service account when running in a "
        "cluster, else $KUBECONFIG or ~/.kube/config.",
    )
    k8s_data_pvc: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$",
        description="A ReadWriteMany PersistentVolumeClaim holding ORCH_DATA_DIR (several nodes); unset: a "
        "hostPath of ORCH_DATA_DIR (one node).",
    )
    k8s_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="imagePullPolicy of sandbox pods (`Never`: images loaded into the nodes)."
    )
    k8s_cpu_request: float | None = Field(
        None,
        gt=0,
        description="CPU the scheduler reserves per sandbox pod; unset: its limit, ORCH_SANDBOX_CPUS (Guaranteed QoS).",
    )
    k8s_memory_request_mb: int | None = Field(
        None,
        gt=0,
        description="Memory (MiB) the scheduler reserves per sandbox pod; unset: its limit, ORCH_SANDBOX_MEMORY_MB.",
    )
    k8s_agent_port: int = Field(
        7000, gt=0, lt=65536, description="Port of the agent on each sandbox pod's loopback (port-forwarded)."
    )
    k8s_tolerations: tuple[K8sToleration, ...] = Field(
        (),
        description='Tolerations of sandbox pods, a JSON list such as [{"key": "sandboxes", "value": "true", '
        '"effect": "NoSchedule"}]: lets them onto nodes tainted for sandboxes (docs/kubernetes-scale.md).',
    )
    k8s_runtime_class: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",  # a RuntimeClass name (a DNS subdomain)
        description="`runtimeClassName` of sandbox pods (e.g. `gvisor`, a RuntimeClass the cluster defines); "
        "unset: the cluster's default runtime.",
    )
    settings_file: Path | None = Field(
        None, description="Optional dotenv file with the same keys; watched for identity-mode changes."
    )
    idle_timeout_s: float = Field(900.0, gt=0, description="Stop a user's sandbox after this idle time.")
    tool_timeout_s: float = Field(60.0, gt=0, description="Default `shell` timeout.")
    tool_timeout_max_s: float = Field(600.0, gt=0, description="Largest `timeout_s` a shell call may ask for.")
    mcp_progress_interval_s: float = Field(
        2.0,
        ge=0.1,  # a notification per tick costs the client a line to read; 10 a second is plenty
        le=60,
        description="How often a long MCP tools/call (shell, process tools) sends a progress notification "
        "when the client asked for progress (docs/mcp.md).",
    )
    grep_timeout_s: float = Field(
        10.0, gt=0, description="Time limit of one grep_search (catastrophic regexes answer `timeout`)."
    )
    agent_call_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Deadline of a sandbox call other than shell (whose deadline is its timeout_s plus a margin); "
        "an agent that misses it is replaced before the next call.",
    )
    user_max_concurrent_calls: int = Field(
        8, gt=0, description="Tool calls one user may have running at once; more answer `busy`."
    )
    output_cap_bytes: int = Field(256 * 1024, gt=0, description="Cap on a tool's text output.")
    read_bytes_max: int = Field(20 * 1024 * 1024, gt=0, description="Cap on read_bytes / send_file size.")
    shell_output_cap_bytes: int = Field(
        32 * 1024,
        ge=256,
        description="Text a shell answer shows of stdout and stderr together; a longer stream keeps its head "
        "and tail around an 'N bytes omitted' marker and is spooled in full to the session's shell-output/.",
    )
    process_max_per_user: int = Field(
        16, gt=0, description="Background processes (process_start) one user's sandbox may run at once."
    )
    process_spool_bytes: int = Field(
        8 * 1024 * 1024,
        ge=4096,
        description="Output kept per background process: a ring in the session's shell-output/ (oldest bytes dropped).",
    )
    process_max_runtime_s: float = Field(
        86400.0, gt=0, description="A background process running longer is killed (whole tree)."
    )
    # Code kernels (run_code, docs/interpreter.md).
    kernels_per_user: int = Field(
        4, gt=0, description="Code kernels (run_code) one user's sandbox may run at once; more answer too_many_kernels."
    )
    kernel_idle_s: float = Field(1800.0, gt=0, description="A code kernel unused this long is shut down (its state lost).")
    kernel_python: str = Field(
        "python3",
        min_length=1,
        description="The python that runs code kernels in a sandbox (needs ipykernel): a name on the sandbox's PATH "
        "or an absolute path.",
    )
    shell_spool_max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="Bytes of spooled shell output kept per session (oldest files rotated out; one file holds "
        "at most half of it); 0 turns the spool off.",
    )
    upload_max_bytes: int = Field(
        50 * 1024 * 1024,
        gt=0,
        description="Largest file a bot may upload into a sandbox (PUT /v1/runs/{run_id}/files/incoming/{name}); "
        "larger bodies answer 413.",
    )
    url_fetch_timeout_s: float = Field(15.0, gt=0, description="Timeout when the host fetches an http(s) URL.")
    url_fetch_allow_loopback: bool = Field(
        False, description="Let send_* fetch loopback URLs (tests, single-host setups); private ranges never."
    )
    image_max_bytes: int = Field(10 * 1024 * 1024, gt=0, description="Cap on send_image size.")
    delivery_ttl_s: float = Field(86400.0, gt=0, description="How long an outgoing delivery stays fetchable.")
    tool_call_result_ttl_s: float = Field(
        86400.0, gt=0, description="How long a tool call's recorded result answers repeats of its (run, tool_call_id)."
    )
    tool_call_result_max_bytes: int = Field(
        2 * 1024 * 1024,
        ge=1024,
        description="Largest recorded result (JSON bytes) kept for repeats; a larger one is recorded as "
        "'ran, result not kept', so a repeat still never runs the call again.",
    )
    run_max_idle_s: float = Field(
        4 * 3600.0, ge=0, description="End a run as failed after this long without a tool call (0: never)."
    )
    delivery_sweep_interval_s: float = Field(
        600.0, ge=0, description="How often expired deliveries are removed (0: never)."
    )
    sandbox_uid_base: int = Field(100000, ge=1000, description="A user's sandbox runs as uid base + user id.")
    max_user_id: int = Field(
        MAX_USER_ID,
        ge=1,
        le=MAX_USER_ID,
        description="Largest user id this instance accepts; its sandbox uids are base..base + this "
        "(two orchestrators on one host must not share any).",
    )
    uid_registry_dir: Path = Field(
        Path("/run/sandbox-orchestrator/uid-blocks"),
        description="Where live instances (as root) record their sandbox uid blocks; tests point it elsewhere.",
    )
    group_gid_base: int = Field(
        2_000_000_000, ge=1000, description="First gid given to a group workspace (one gid per group)."
    )
    group_gid_count: int = Field(
        100_000_000, gt=0, description="How many group gids there are; the range may not overlap the sandbox uids."
    )
    process_sandbox: Literal["none", "bwrap"] = Field(
        "none", description="`bwrap`: the process backend runs each agent in a mount namespace built from the plan."
    )
    agent_resolver: Literal["auto", "openat2", "walk"] = Field(
        "auto", description="PathSandbox resolver: openat2 where the kernel has it, else the O_NOFOLLOW walk."
    )
    sandbox_image: str = Field("sandbox-orchestrator/sandbox:latest", description="Docker image of sandboxes.")
    sandbox_network: str = Field("none", description="Docker network of sandboxes.")
    # Templates (docs/templates.md): images admins define as layers over the default workbench.
    template_repository: str = Field(
        "sandbox-orchestrator/template",
        pattern=r"^[a-z0-9][a-z0-9._/:-]*[a-z0-9]$",
        description="Repository template images are tagged in (`<repository>:<recipe hash>`).",
    )
    template_fetch_network: str = Field(
        "host",
        description="Docker network of a template build's fetch step (apt/pip/npm downloads from Debian's "
        "mirror and the package indexes); the image build itself always runs with no network.",
    )
    template_build_timeout_s: float = Field(1800, gt=0, description="Longest a template's fetch or build may take.")
    image_registry: str | None = Field(
        None,
        description="Registry template images are pushed to for the kubernetes backend (`host:port/path`); unset: "
        "they are loaded into ORCH_K8S_NODE_ENGINES instead.",
    )
    k8s_node_engines: str = Field(
        "",
        description="Comma-separated Docker engines of a local cluster's nodes (`unix:///...sock`) template "
        "images are loaded into when ORCH_IMAGE_REGISTRY is unset.",
    )
    sandbox_runtime: Literal["runc", "runsc"] = Field(
        "runc",
        description="OCI runtime of docker sandboxes: `runc` (namespaces on the host's kernel) or `runsc` "
        "(gVisor: a user-space kernel between the sandbox and the host's; registered with dockerd as `runsc`, "
        "deploy/docker/register-runsc; docs/security.md).",
    )
    egress: Literal["off", "allowlist"] = Field(
        "allowlist",
        description="`allowlist`: sandboxes reach only ORCH_EGRESS_ALLOW (plus per-user changes) through the "
        "orchestrator's egress proxy (docs/egress.md); `off`: no proxy, no way out.",
    )
    egress_allow: str = Field(
        ", ".join(DEFAULT_EGRESS_ALLOW),
        description="Host patterns sandboxes may reach (`host`, `*.domain`, optional `:port` or `:*`; no port "
        "means 443), separated by commas; the default is the public package registries.",
    )
    egress_allow_loopback: bool = Field(
        False, description="Let the egress proxy connect to loopback addresses (tests only); private ranges never."
    )
    egress_forwarder_port: int = Field(
        3128, gt=0, lt=65536, description="Port of the in-sandbox forwarder on 127.0.0.1 (a private network only)."
    )
    egress_max_connections: int = Field(64, gt=0, description="Egress connections one user may have open at once.")
    egress_max_bytes_per_connection: int = Field(
        1024 * 1024 * 1024, gt=0, description="Bytes (both ways) one egress connection may carry before it is cut."
    )
    egress_max_bytes_per_day: int = Field(
        10 * 1024 * 1024 * 1024, gt=0, description="Egress bytes one user may move per UTC day."
    )
    egress_ca_bundle: Path = Field(
        Path("/etc/ssl/certs/ca-certificates.crt"),
        description="The host's CA bundle: mounted read-only into docker sandboxes at the same path, and what "
        "pip and npm there are told to trust (TLS to the registries may be re-signed by a local CA).",
    )
    egress_connect_timeout_s: float = Field(10.0, gt=0, description="Time the egress proxy waits for an upstream.")
    egress_dns_servers: str = Field(
        "",
        description="Name servers the egress proxy asks (`ip` or `ip:port`, separated by commas); empty: the host's "
        "(/etc/resolv.conf, after /etc/hosts).",
    )
    egress_dns_timeout_s: float = Field(
        10.0, gt=0, description="How long the egress proxy waits for a name lookup before it answers 502 (reason dns)."
    )
    egress_dns_lookups_per_user: int = Field(
        16, gt=0, description="Name lookups one user's egress connections may have in flight at once; more are answered 429."
    )
    egress_dns_lookups: int = Field(
        256,
        gt=0,
        description="Name lookups in flight for all users together (above the per-user cap); more are answered 503.",
    )
    # Credentials injected at the egress proxy (docs/credentials.md).
    credentials_key: SecretStr | None = Field(
        None,
        description="Fernet key(s) that encrypt users' credentials at rest (commas between; the first encrypts, all "
        "decrypt: a rotation puts the new key first). Unset, with no key file: credentials are off.",
    )
    credentials_key_file: Path | None = Field(
        None, description="A file holding the credentials key(s) instead (outside the data dir, mode 600); re-read by a rotation."
    )
    grant_max_s: int = Field(86400, gt=0, description="The longest a credential may be delegated for (ttl_s of a grant).")
    egress_upstream_ca_bundle: Path | None = Field(
        None,
        description="What the egress proxy verifies an upstream's certificate against when it injects a credential; "
        "unset: ORCH_EGRESS_CA_BUNDLE.",
    )
    sandbox_cpus: float = Field(1.0, gt=0, description="CPU limit per sandbox.")
    sandbox_memory_mb: int = Field(1024, gt=0, description="Memory limit per sandbox (MiB).")
    sandbox_pids: int = Field(512, gt=0, description="Process limit per sandbox.")
    # The admin console and per-user resources (docs/admin-console.md).
    user_max_cpus: float = Field(
        4.0, gt=0, description="The most CPUs an admin may give one user's sandbox (PUT /v1/admin/users/{uid}/resources)."
    )
    user_max_memory_mb: int = Field(
        8192, gt=0, description="The most memory (MiB) an admin may give one user's sandbox."
    )
    console_session_ttl_s: float = Field(
        3600.0, gt=0, description="How long an admin console login lasts before it asks for the token again."
    )
    sandbox_shm_mb: int = Field(
        64, gt=0, description="Size of /dev/shm (a tmpfs of its own) in a bwrap sandbox of the process backend (MiB)."
    )
    sandbox_ready_timeout_s: float = Field(
        30.0, gt=0, description="How long a starting sandbox's agent may take to answer /health."
    )
    skill_gc_days: float = Field(7.0, ge=0, description="Unreferenced skill content older than this is removed.")
    skill_gc_interval_s: float = Field(
        3600.0, ge=0, description="How often the server collects skill-store garbage (0: never)."
    )
    skill_upload_max_files: int = Field(1000, gt=0, description="Files in one skill installed through the API.")
    skill_upload_max_file_bytes: int = Field(
        5 * 1024 * 1024, gt=0, description="Size of one file of a skill installed through the API."
    )
    skill_upload_max_bytes: int = Field(
        20 * 1024 * 1024, gt=0, description="Total size of a skill installed through the API."
    )
    http_body_max_bytes: int = Field(
        4 * 1024 * 1024,
        gt=0,
        description="Largest request body of a route without its own cap (skill PUTs and tool calls derive theirs).",
    )
    http_body_stall_s: float = Field(
        10.0, gt=0, description="A request body that sends nothing for this long is answered 408 and closed."
    )
    http_body_timeout_s: float = Field(
        60.0, gt=0, description="A request body must be complete within this time (else 408, closed)."
    )
    http_keep_alive_s: float = Field(5.0, gt=0, description="An idle keep-alive connection is closed after this time.")
    http_limit_concurrency: int = Field(
        1000, gt=0, description="Connections and requests at once; beyond it the server answers 503."
    )
    # Preview URLs (docs/previews.md): a link to a port a sandbox listens on, served on a
    # listener of its own (never the API's origin) and relayed through the sandbox's agent.
    preview_listen: str | None = Field(
        None, pattern=r"^[^\s:/]+:\d{1,5}$",
        description="host:port of the preview listener (port 0: any free port); unset: previews are off.",
    )  # fmt: skip
    preview_base_url: str | None = Field(
        None,
        description="The preview listener's public origin, as links name it (path mode: {base}/{token}/); with "
        "`{token}` in it, host mode (https://{token}.preview.example.com: a wildcard DNS name). Unset: "
        "http://{ORCH_PREVIEW_LISTEN} as bound.",
    )
    preview_ttl_s: int = Field(3600, gt=0, description="How long a preview link lives when its request names no ttl_s.")
    preview_ttl_max_s: int = Field(7 * 86400, gt=0, description="The longest ttl_s a preview may ask for.")
    preview_max_bytes_per_day: int = Field(
        5 * 1024**3, gt=0, description="Bytes (both ways) one user's previews may relay per UTC day; then 429."
    )
    preview_cookie_link_s: int | None = Field(
        None, gt=0,
        description="Unset: a preview's link is all a visitor needs. Set: every preview requires an HttpOnly cookie "
        "signed with a host-side key, which its link mints on a visit within this many seconds of being handed "
        "out (then a redirect to the URL without the key); other requests without the cookie answer 403.",
    )  # fmt: skip
    preview_head_timeout_s: float = Field(
        10.0, gt=0, description="Time a visitor has to send a whole request head to the preview listener."
    )
    preview_idle_timeout_s: float = Field(
        120.0, gt=0, description="A preview connection on which nothing moved either way for this long is closed."
    )
    # The server's file descriptors (docs/operations.md, "Descriptor budget"): checked against
    # the process's limit when `serve` starts (orchestrator/descriptors/budget.py).
    fd_limit: int | None = Field(
        None, ge=256, description="RLIMIT_NOFILE (soft) `serve` raises itself to at start; unset: the hard limit."
    )
    fd_reserve: int | None = Field(
        None, ge=64,
        description="Descriptors never lent to egress or streams: the API, /healthz, SQLite, logs, backend "
        "clients; unset: a quarter of the limit, at least 256.",
    )  # fmt: skip
    fd_egress_pct: float = Field(
        60.0, gt=0, le=100, description="Percent of the descriptors past the reserve that egress connections may hold."
    )
    fd_streams_pct: float = Field(
        20.0, gt=0, le=100,
        description="Percent of the descriptors past the reserve that streamed answers (shell SSE, MCP streams) may hold.",
    )  # fmt: skip
    fd_previews_pct: float = Field(
        10.0, gt=0, le=100, description="Percent of the descriptors past the reserve that preview connections may hold."
    )
    fd_user_pct: float = Field(
        25.0, gt=0, le=100, description="Percent of each of those pools one user may hold."
    )
    access_log: bool = Field(
        True, description="Log one structured line per HTTP request (logger orchestrator.access, docs/operations.md)."
    )
    http_max_header_bytes: int = Field(64 * 1024, gt=0, description="Largest request head (request line and headers).")
    transcript_turns: int = Field(200, gt=0, description="Turns kept in a session's transcript.")
    conversation_read_max_chars: int = Field(
        20_000, ge=1_000, description="Cap on the text read_conversation and session_search return."
    )
    disk_quota: Literal["auto", "loop", "scan", "off"] = Field(
        "auto",
        description="Per-user disk quotas: `loop` (a loop-mounted ext4 image per user, share/ and group; root), "
        "`scan` (a periodic usage scan stops an over-quota sandbox), `auto` (loop when root with loop devices, "
        "else scan) or `off` (docs/disk-quotas.md).",
    )
    user_disk_quota_mb: int = Field(1024, ge=8, description="Default disk quota of a user's image (MiB).")
    user_inode_quota: int = Field(100_000, ge=64, description="Default inode (file) quota of a user's image.")
    shared_disk_quota_mb: int = Field(
        4096, ge=8, description="Disk quota of share/ and of each group workspace (MiB), each its own image."
    )
    shared_inode_quota: int = Field(200_000, ge=64, description="Inode quota of share/ and of each group workspace.")
    shared_member_share_pct: float = Field(
        25.0,
        gt=0,
        le=100,
        description="How much of share/ or of a group workspace one member's files may hold (percent of its bytes and "
        "of its files): a member over it has its sandbox stopped and its writes there refused (docs/disk-quotas.md).",
    )
    disk_scan_interval_s: float = Field(
        30.0,
        gt=0,
        le=30.0,
        description="scan: how often every user's usage is counted; either mechanism: how often each member's "
        "share of share/ and the group workspaces is measured (at most 30 s apart).",
    )
    disk_unmount_on_close: bool = Field(
        False, description="Unmount the disk images when the orchestrator stops (default: keep; the next start adopts them)."
    )
    min_free_disk_pct: float = Field(
        5.0,
        ge=0,
        le=100,
        description="Below this free share of the data filesystem, new sandbox starts and host writes are refused (0: off).",
    )
    user_host_copies_mb: int = Field(
        256,
        ge=1,
        description="Per-user budget (MiB) of the host-side copies of what a user's sandbox produced: outgoing "
        "deliveries, recorded tool results and transfers in flight; past it they are refused with no_space. "
        "Its own setting, not part of the user's disk quota (docs/disk-quotas.md).",
    )
    collaboration_queue_max: int = Field(20, gt=0, description="Requests waiting per target session.")
    collaboration_clarifications_max: int = Field(3, ge=0, description="Clarifications per request.")
    collaboration_continuations_max: int = Field(
        5, ge=0, description="Automatic continuation runs per piece of source work."
    )
    collaboration_merge_max: int = Field(10, gt=0, description="Answers merged into one continuation delivery.")
    collaboration_message_max_chars: int = Field(16000, gt=0, description="Length of one collaboration message.")
    collaboration_claim_timeout_s: float = Field(
        120.0, gt=0, description="A delivery taken from the inbox must be started within this time."
    )
    collaboration_inbox_wait_max_s: float = Field(30.0, gt=0, description="Longest inbox long-poll.")
    pause_after_s: float = Field(
        120.0,
        ge=0,
        description="Freeze (docker pause / SIGSTOP) a sandbox idle this long; the next call resumes it. "
        "0, or not below ORCH_IDLE_TIMEOUT_S: never pause (docs/lifecycle.md).",
    )
    dead_man_margin_s: float = Field(
        60.0,
        ge=0,
        description="A sandbox with no call for ORCH_IDLE_TIMEOUT_S plus this margin stops itself, "
        "even when no orchestrator is left to stop it; a docker sandbox also ends that long after the "
        "orchestrator last renewed its lease (docs/lifecycle.md).",
    )
    transfers_max: int = Field(
        4,
        gt=0,
        description="send_file / send_image / publish_artifact transfers at once, all users together "
        "(with streaming, the RSS bound: docs/lifecycle.md).",
    )
    user_transfers_max: int = Field(2, gt=0, description="The same, per acting user.")
    transfer_wait_s: float = Field(
        30.0, ge=0, description="How long a transfer waits for a free slot before it is refused with busy."
    )
    metrics_top_users: int = Field(
        20, gt=0, description="Users with the most calls in flight shown one by one on /metrics (the rest summed)."
    )

    @field_validator("egress_allow")
    @classmethod
    def _egress_patterns(cls, value: str) -> str:
        parse_patterns(split_allow_setting(value))  # InvalidPattern is a ValueError: one clear line
        return value

    @field_validator("egress_dns_servers")
    @classmethod
    def _egress_dns_servers(cls, value: str) -> str:
        parse_dns_servers(value)
        return value

    @model_validator(mode="after")
    def _egress_dns_caps(self) -> Settings:
        if self.egress_dns_lookups <= self.egress_dns_lookups_per_user:
            raise ValueError(
                f"ORCH_EGRESS_DNS_LOOKUPS ({self.egress_dns_lookups}) must be above ORCH_EGRESS_DNS_LOOKUPS_PER_USER "
                f"({self.egress_dns_lookups_per_user}): one user must not take every lookup slot"
            )
        return self

    @model_validator(mode="after")
    def _id_ranges_apart(self) -> Settings:
        # A group gid equal to some user's sandbox uid (= that user's own gid) would let that
        # user into the group's workspace.
        users = (self.sandbox_uid_base, self.sandbox_uid_base + self.max_user_id)
        groups = (self.group_gid_base, self.group_gid_base + self.group_gid_count - 1)
        if groups[0] <= users[1] and users[0] <= groups[1]:
            raise ValueError(
                f"the group gid range {groups[0]}..{groups[1]} (ORCH_GROUP_GID_BASE, ORCH_GROUP_GID_COUNT) "
                f"overlaps the sandbox uids {users[0]}..{users[1]} (ORCH_SANDBOX_UID_BASE + user ids)"
            )
        for size, inodes, names in (
            (self.user_disk_quota_mb, self.user_inode_quota, "ORCH_USER_DISK_QUOTA_MB / ORCH_USER_INODE_QUOTA"),
            (self.shared_disk_quota_mb, self.shared_inode_quota, "ORCH_SHARED_DISK_QUOTA_MB / ORCH_SHARED_INODE_QUOTA"),
        ):
            # ext4 keeps 256 bytes per inode in its inode tables, inside the image: at most half of it.
            if inodes * EXT4_INODE_BYTES > size * 2**20 // 2:
                raise ValueError(
                    f"{inodes} inodes need {inodes * EXT4_INODE_BYTES // 2**20} MiB of inode tables, more than half of "
                    f"a {size} MiB image ({names}): give a larger size or fewer inodes"
                )
        if self.fd_egress_pct + self.fd_streams_pct + self.fd_previews_pct > 100:
            raise ValueError(
                f"ORCH_FD_EGRESS_PCT ({self.fd_egress_pct:g}), ORCH_FD_STREAMS_PCT ({self.fd_streams_pct:g}) and "
                f"ORCH_FD_PREVIEWS_PCT ({self.fd_previews_pct:g}) together take more than 100 % of the descriptors "
                "past the reserve"
            )
        if self.preview_ttl_s > self.preview_ttl_max_s:
            raise ValueError("ORCH_PREVIEW_TTL_S may not be longer than ORCH_PREVIEW_TTL_MAX_S")
        if max(users[1], groups[1]) > MAX_ID:
            raise ValueError(f"sandbox uids and group gids must stay at or below {MAX_ID}")
        return self

    @property
    def group_gid_range(self) -> GidRange:
        return GidRange(self.group_gid_base, self.group_gid_count)

    @property
    def sandbox_id_ranges(self) -> tuple[IdRange, ...]:
        """Every uid and gid a sandbox may carry: the users' own and the group workspaces'."""
        groups = self.group_gid_range
        return (IdRange(self.sandbox_uid_base, self.sandbox_uid_base + self.max_user_id), IdRange(groups.first, groups.last))

    @property
    def credentials_on(self) -> bool:
        return self.credentials_key is not None or self.credentials_key_file is not None

    @property
    def sandbox_ca_bundle(self) -> Path:
        """The CA bundle sandboxes trust: with credentials on, the host's bundle plus the
        deployment CA's certificate (orchestrator/credentials/ca.py), else the host's."""
        if self.credentials_on and self.egress != "off":
            return self.layout.root / "ca" / "sandbox-bundle.pem"
        return self.egress_ca_bundle

    @property
    def upstream_ca_bundle(self) -> Path:
        return self.egress_upstream_ca_bundle or self.egress_ca_bundle

    @property
    def layout(self) -> DataLayout:
        return DataLayout(self.data_dir)

    @property
    def identity_mode(self) -> tuple[IdentityMode, str | None]:
        return parse_identity_mode(self.runtime_identity)

    @property
    def auth_enabled(self) -> bool:
        return self.api_token is not None or self.admin_token is not None

    @property
    def runtime_identity_set(self) -> bool:
        """Whether ORCH_RUNTIME_IDENTITY was given (environment, settings file or constructor)."""
        return "runtime_identity" in self.model_fields_set


# --- each package's own section -----------------------------------------------------------
# A package receives its section, never the whole `Settings`: the few values it reads, named
# without the package's prefix. `Settings` stays the one place that reads the `ORCH_`
# variables (their names unchanged); a section field names the `Settings` field (or property)
# it is read from as its `validation_alias`, and `of` builds the section from it.


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    @classmethod
    def nested(cls) -> dict[str, type[Section]]:
        """Pure: section field -> the section nested there (built from `Settings` by its own `of`)."""
        return {
            name: field.annotation
            for name, field in cls.model_fields.items()
            if isinstance(field.annotation, type) and issubclass(field.annotation, Section)
        }

    @classmethod
    def sources(cls) -> dict[str, str]:
        """Pure: section field -> the `Settings` field or property it is read from (a nested
        section's fields are its own)."""
        nested = cls.nested()
        return {
            name: field.validation_alias if isinstance(field.validation_alias, str) else name
            for name, field in cls.model_fields.items()
            if name not in nested
        }

    @classmethod
    def of(cls, settings: Settings) -> Self:
        values: dict[str, object] = {source: getattr(settings, source) for source in cls.sources().values()}
        values.update({name: section.of(settings) for name, section in cls.nested().items()})
        return cls.model_validate(values)


class EgressSettings(Section):
    """orchestrator/egress/ (docs/egress.md)."""

    mode: Literal["off", "allowlist"] = Field(validation_alias="egress")
    allow: str = Field(validation_alias="egress_allow")
    allow_loopback: bool = Field(validation_alias="egress_allow_loopback")
    connect_timeout_s: float = Field(validation_alias="egress_connect_timeout_s")
    max_connections: int = Field(validation_alias="egress_max_connections")
    max_bytes_per_connection: int = Field(validation_alias="egress_max_bytes_per_connection")
    max_bytes_per_day: int = Field(validation_alias="egress_max_bytes_per_day")
    dns_servers: str = Field(validation_alias="egress_dns_servers")
    dns_timeout_s: float = Field(validation_alias="egress_dns_timeout_s")
    dns_lookups_per_user: int = Field(validation_alias="egress_dns_lookups_per_user")
    dns_lookups: int = Field(validation_alias="egress_dns_lookups")


class PreviewSettings(Section):
    """orchestrator/previews/ (docs/previews.md)."""

    listen: str = Field(validation_alias="preview_listen")
    base_url: str | None = Field(validation_alias="preview_base_url")
    ttl_s: int = Field(validation_alias="preview_ttl_s")
    ttl_max_s: int = Field(validation_alias="preview_ttl_max_s")
    max_bytes_per_day: int = Field(validation_alias="preview_max_bytes_per_day")
    cookie_link_s: int | None = Field(validation_alias="preview_cookie_link_s")
    head_timeout_s: float = Field(validation_alias="preview_head_timeout_s")
    idle_timeout_s: float = Field(validation_alias="preview_idle_timeout_s")
    layout: DataLayout  # the access-cookie key lives in its state dir


class DiskQuotaSettings(Section):
    """orchestrator/quotas/ (docs/disk-quotas.md)."""

    mechanism: Literal["auto", "loop", "scan", "off"] = Field(validation_alias="disk_quota")
    user_disk_quota_mb: int
    user_inode_quota: int
    shared_disk_quota_mb: int
    shared_inode_quota: int
    shared_member_share_pct: float
    min_free_disk_pct: float
    unmount_on_close: bool = Field(validation_alias="disk_unmount_on_close")
    sandbox_uid_base: int
    max_user_id: int
    sandbox_id_ranges: tuple[IdRange, ...]
    layout: DataLayout


class TemplateSettings(Section):
    """orchestrator/templates/ (docs/templates.md)."""

    sandbox_image: str
    repository: str = Field(validation_alias="template_repository")
    fetch_network: str = Field(validation_alias="template_fetch_network")
    build_timeout_s: float = Field(validation_alias="template_build_timeout_s")
    image_registry: str | None
    k8s_node_engines: str
    egress_ca_bundle: Path  # what a template's fetch step trusts
    layout: DataLayout


class CredentialSettings(Section):
    """orchestrator/credentials/ (docs/credentials.md)."""

    key: SecretStr | None = Field(validation_alias="credentials_key")
    key_file: Path | None = Field(validation_alias="credentials_key_file")
    grant_max_s: int
    egress: Literal["off", "allowlist"]
    egress_ca_bundle: Path
    sandbox_ca_bundle: Path
    layout: DataLayout


class DescriptorSettings(Section):
    """orchestrator/descriptors/ (docs/operations.md): the split of the descriptor limit."""

    reserve: int | None = Field(validation_alias="fd_reserve")
    egress_pct: float = Field(validation_alias="fd_egress_pct")
    streams_pct: float = Field(validation_alias="fd_streams_pct")
    previews_pct: float = Field(validation_alias="fd_previews_pct")
    user_pct: float = Field(validation_alias="fd_user_pct")


class HostToolSettings(Section):
    """orchestrator/tools/host_tools.py: the host tools' caps and the transfer slots."""

    read_bytes_max: int
    image_max_bytes: int
    public_base_url: str
    transfers_max: int
    user_transfers_max: int
    transfer_wait_s: float


class CallSettings(Section):
    """The calls to the sandboxes' agents (orchestrator/sandboxes/router.py, calling.py,
    agent_calls.py; a repeat's wait in tools/call_records.py): deadlines and the per-user cap."""

    agent_call_timeout_s: float
    tool_timeout_s: float
    tool_timeout_max_s: float
    process_max_runtime_s: float
    user_max_concurrent_calls: int


class AgentSettings(Section):
    """What each sandbox's agent is configured with (orchestrator/sandboxes/agent_launch.py):
    the bounds of its answers and tools (a host client holds its answers to them too)."""

    output_cap_bytes: int
    shell_output_cap_bytes: int
    shell_spool_max_bytes: int
    read_bytes_max: int
    tool_timeout_s: float
    tool_timeout_max_s: float
    grep_timeout_s: float
    process_max_per_user: int
    process_spool_bytes: int
    process_max_runtime_s: float
    kernels_per_user: int
    kernel_idle_s: float
    kernel_python: str
    resolver: Literal["auto", "openat2", "walk"] = Field(validation_alias="agent_resolver")


class KubernetesSettings(Section):
    """The kubernetes backend (orchestrator/sandboxes/kubernetes*.py, docs/kubernetes.md)."""

    namespace: str = Field(validation_alias="k8s_namespace")
    kubeconfig: Path | None = Field(validation_alias="k8s_kubeconfig")
    data_pvc: str | None = Field(validation_alias="k8s_data_pvc")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(validation_alias="k8s_image_pull_policy")
    cpu_request: float | None = Field(validation_alias="k8s_cpu_request")
    memory_request_mb: int | None = Field(validation_alias="k8s_memory_request_mb")
    agent_port: int = Field(validation_alias="k8s_agent_port")
    tolerations: tuple[K8sToleration, ...] = Field(validation_alias="k8s_tolerations")
    runtime_class: str | None = Field(validation_alias="k8s_runtime_class")


class SandboxSettings(Section):
    """orchestrator/sandboxes/ but its calls (`CallSettings`): the backend choice, the lifecycle
    engine and its drivers (docs/lifecycle.md), what every sandbox gets, its agent's
    configuration (`agent`) and the kubernetes backend's own (`kubernetes`)."""

    backend: Literal["auto", "docker", "process", "kubernetes"]
    image: str = Field(validation_alias="sandbox_image")
    network: str = Field(validation_alias="sandbox_network")
    runtime: Literal["runc", "runsc"] = Field(validation_alias="sandbox_runtime")
    process_sandbox: Literal["none", "bwrap"]
    cpus: float = Field(validation_alias="sandbox_cpus")
    memory_mb: int = Field(validation_alias="sandbox_memory_mb")
    pids: int = Field(validation_alias="sandbox_pids")
    shm_mb: int = Field(validation_alias="sandbox_shm_mb")
    ready_timeout_s: float = Field(validation_alias="sandbox_ready_timeout_s")
    idle_timeout_s: float
    pause_after_s: float
    dead_man_margin_s: float
    egress: Literal["off", "allowlist"]
    egress_forwarder_port: int
    ca_bundle: Path = Field(validation_alias="sandbox_ca_bundle")  # what pip and npm there trust
    layout: DataLayout
    agent: AgentSettings
    kubernetes: KubernetesSettings


class ApiSettings(Section):
    """orchestrator/http/, orchestrator/console/ and the MCP endpoint: the tokens, the request
    guard's and the server's bounds, and the few values routes read."""

    api_token: SecretStr | None
    admin_token: SecretStr | None
    auth_enabled: bool  # either token set (a property of Settings)
    access_log: bool
    http_body_max_bytes: int
    http_body_stall_s: float
    http_body_timeout_s: float
    http_keep_alive_s: float
    http_limit_concurrency: int
    http_max_header_bytes: int
    skill_upload_max_bytes: int
    skill_upload_max_files: int
    upload_max_bytes: int
    read_bytes_max: int
    max_user_id: int
    tool_timeout_max_s: float
    collaboration_inbox_wait_max_s: float
    console_session_ttl_s: float
    mcp_progress_interval_s: float
    egress: Literal["off", "allowlist"]


class CollaborationSettings(Section):
    """orchestrator/collaboration/ (docs/collaboration.md): the bounds of requests between sessions."""

    queue_max: int = Field(validation_alias="collaboration_queue_max")
    clarifications_max: int = Field(validation_alias="collaboration_clarifications_max")
    continuations_max: int = Field(validation_alias="collaboration_continuations_max")
    merge_max: int = Field(validation_alias="collaboration_merge_max")
    message_max_chars: int = Field(validation_alias="collaboration_message_max_chars")
    claim_timeout_s: float = Field(validation_alias="collaboration_claim_timeout_s")


class IdentitySettings(Section):
    """orchestrator/runs/identity_switch.py: the configured runtime identity mode and the
    settings file watched for its edits."""

    runtime_identity: str
    runtime_identity_set: bool  # given, not the default
    settings_file: Path | None


SECTIONS: tuple[type[Section], ...] = (
    EgressSettings, PreviewSettings, DiskQuotaSettings, TemplateSettings, CredentialSettings, DescriptorSettings,
    HostToolSettings, CallSettings, ApiSettings, CollaborationSettings, IdentitySettings,
    SandboxSettings, AgentSettings, KubernetesSettings,  # the last two: nested in SandboxSettings
)  # fmt: skip


def settings_error_lines(exc: ValidationError) -> list[str]:
    """Pure: one line per bad setting, naming its variable and what it accepts (no traceback)."""
    lines = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "bool_parsing":
            message = "Input should be true or false (also 1/0, yes/no, on/off)"
        if message.startswith("Input should be "):
            message = "it must be " + message.removeprefix("Input should be ")
        if not error["loc"]:  # a check across settings: its message names them
            lines.append(f"invalid settings: {message}")
            continue
        variable = "ORCH_" + str(error["loc"][0]).upper()
        lines.append(f"invalid setting {variable}={error['input']!r}: {message}")
    return lines


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment and the optional settings file it names."""
    settings_file = overrides.get("settings_file") or os.environ.get("ORCH_SETTINGS_FILE")
    if settings_file:
        return Settings(_env_file=str(settings_file), **overrides)  # type: ignore[arg-type]
    return Settings(**overrides)  # type: ignore[arg-type]
