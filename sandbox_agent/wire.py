"""The wire between the orchestrator and a sandbox agent: tool arguments (the public names),
the agent's configuration, request/response envelopes, health and the structured error.

These models are the contract the backends (process, docker) and the agent share.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, computed_field, model_validator

from sandbox_agent.names import escape_names

TOOL_PATH_MAX = 4096  # bytes, like Linux PATH_MAX: longer arguments are refused up front


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- tool arguments -------------------------------------------------------------------------

_PATH_DOC = "Absolute path, or relative to the run's working directory."


# What the schema a model receives says of a path, and what is checked before the agent's own
# byte limits: at most TOOL_PATH_ARG_MAX characters (the longest path the kernel opens,
# PATH_MAX less its NUL), no name longer than NAME_MAX characters, no NUL. A JSON Schema
# counts characters, not bytes; for ASCII, the common case, the two agree.
TOOL_PATH_ARG_MAX = TOOL_PATH_MAX - 1
TOOL_PATH_PATTERN = r"^(?![^/]*[^/]{256})(?!.*/[^/]{256})[^\x00]*$"
# Schema only: the agent checks these itself (path_sandbox.parse), since a length constraint
# here would refuse names that are not UTF-8 (surrogate escapes), which the wire carries.
PATH_FIELD: dict[str, Any] = {
    "json_schema_extra": {"minLength": 1, "maxLength": TOOL_PATH_ARG_MAX, "pattern": TOOL_PATH_PATTERN},
}
_PATH = PATH_FIELD
# An optional path: left out (or null) means the default, and so does "" (older callers send it).
_OPTIONAL_PATH: dict[str, Any] = {"json_schema_extra": {"maxLength": TOOL_PATH_ARG_MAX, "pattern": TOOL_PATH_PATTERN}}
# Padded standard base64; white space anywhere is dropped before decoding.
_B64 = r"[A-Za-z0-9+/]\s*"
BASE64_WITH_SPACES_PATTERN = rf"^\s*(?:(?:{_B64}){{4}})*(?:{_B64}{_B64}=\s*=|{_B64}{_B64}{_B64}=)?\s*$"


def _integral(value: object) -> object:
    """JSON has one number type: 3.0 is the integer 3; true stays refused (strict after this)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Strict numbers: a lax parse would take true as 1 and "5" as 5, which the schemas a model
# receives call invalid. The bounds sit inside the type so that they stay in the schema.
def json_int(**bounds: int) -> Any:
    return Annotated[int, Field(strict=True, **bounds), BeforeValidator(_integral)]


# A glob is relative (the directory goes into `path`) and holds no NUL.
GLOB_PATTERN = r"^(?!/)[^\x00]*$"


class ReadFileArgs(_Args):
    path: str = Field(..., description=_PATH_DOC, **_PATH)
    offset: json_int(ge=1) | None = Field(None, description="First line to return (1-based). Default 1.")  # type: ignore[valid-type]
    limit: json_int(ge=1, le=100_000) | None = Field(None, description="How many lines to return. Default 2000.")  # type: ignore[valid-type]


class WriteFileArgs(_Args):
    path: str = Field(..., description=_PATH_DOC + " Missing parent directories are created.", **_PATH)
    content: str = Field(..., description="The complete new content of the file (UTF-8 text).")


# write_bytes: base64 of at most this many bytes (a model's tool call is no upload channel;
# bots upload larger files with PUT /v1/runs/{run_id}/files/incoming/{name}).
WRITE_BYTES_MAX = 8 * 1024 * 1024
WRITE_BYTES_BASE64_MAX = (WRITE_BYTES_MAX + 2) // 3 * 4


class WriteBytesArgs(_Args):
    path: str = Field(..., description=_PATH_DOC + " Missing parent directories are created.", **_PATH)
    content_base64: str = Field(
        ...,
        max_length=WRITE_BYTES_BASE64_MAX,
        json_schema_extra={"pattern": BASE64_WITH_SPACES_PATTERN},
        description=f"The complete new content of the file, base64-encoded (at most {WRITE_BYTES_MAX} bytes decoded).",
    )


class EditFileArgs(_Args):
    path: str = Field(..., description=_PATH_DOC, **_PATH)
    old: str = Field(..., min_length=1, description="Exact text to replace; it must occur exactly once.")
    new: str = Field(..., description="Replacement text.")


class ListDirArgs(_Args):
    path: str = Field(".", description=_PATH_DOC + " Default: the working directory.", **_PATH)


class GlobSearchArgs(_Args):
    # Schema only, like a path: glob_search refuses an empty glob itself and names it, and a
    # length constraint here would refuse a name that is not UTF-8 (surrogate escapes).
    pattern: str = Field(
        ...,
        description="Glob relative to `path`: `*` and `?` within a name, `**` across directories.",
        json_schema_extra={"minLength": 1, "pattern": GLOB_PATTERN},
    )
    path: str | None = Field(None, description=_PATH_DOC + " Default: the working directory.", **_OPTIONAL_PATH)


class GrepSearchArgs(_Args):
    pattern: str = Field(
        ...,
        min_length=1,
        description="Python (`re` syntax) regular expression searched line by line, within a time limit.",
        json_schema_extra={"format": "regex"},
    )
    path: str | None = Field(None, description="File or directory to search. Default: the working directory.", **_OPTIONAL_PATH)
    glob: str | None = Field(
        None,
        description="Only files matching this glob (a name glob like `*.py` matches at any depth).",
        json_schema_extra={"pattern": GLOB_PATTERN},
    )


class ShellArgs(_Args):
    command: str = Field(
        ...,
        min_length=1,
        description="A bash command line, run in the working directory.",
        json_schema_extra={"pattern": r"^[^\x00]*$"},  # no NUL: no argv can hold one
    )
    # The upper bound is the server's ORCH_TOOL_TIMEOUT_MAX_S, put into the schema by GET /v1/tools.
    timeout_s: Annotated[float, Field(strict=True, gt=0)] | None = Field(
        None, description="Seconds before the whole process tree is killed."
    )


class ReadBytesArgs(_Args):
    path: str = Field(..., description=_PATH_DOC, **_PATH)


# --- background processes (sandbox_agent/processes.py, docs/processes.md) ---------------------

PROCESS_ID_PATTERN = r"^p-[0-9a-f]{24}$"
_PROCESS_ID = Field(..., description="The id process_start answered.", pattern=PROCESS_ID_PATTERN, max_length=26)
# Strict: JSON's 0 and "true" are not booleans (the schema a model receives says so).
JsonBool = Annotated[bool, Field(strict=True)]
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
PROCESS_ENV_MAX = 64
PROCESS_ENV_VALUE_MAX = 32 * 1024
PROCESS_WAIT_MAX_S = 60.0
PROCESS_READ_MAX_BYTES = 64 * 1024
PROCESS_WRITE_MAX = 64 * 1024
TERMINAL_MAX = 1000


class ProcessStartArgs(_Args):
    command: str = Field(
        ...,
        min_length=1,
        description="A bash command line, run in the background.",
        json_schema_extra={"pattern": r"^[^\x00]*$"},
    )
    cwd: str | None = Field(None, description=_PATH_DOC + " Default: the working directory.", **_OPTIONAL_PATH)
    env: dict[str, Annotated[str, Field(max_length=PROCESS_ENV_VALUE_MAX, pattern=r"^[^\x00]*$")]] | None = Field(
        None,
        max_length=PROCESS_ENV_MAX,
        description="More environment variables (names: letters, digits, _).",
        json_schema_extra={"propertyNames": {"pattern": ENV_NAME_PATTERN}},
    )
    pty: JsonBool = Field(False, description="Run it in a terminal (stdout and stderr are then one stream).")
    cols: json_int(ge=1, le=TERMINAL_MAX) | None = Field(None, description="Terminal width (pty). Default 80.")  # type: ignore[valid-type]
    rows: json_int(ge=1, le=TERMINAL_MAX) | None = Field(None, description="Terminal height (pty). Default 24.")  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _names(self) -> ProcessStartArgs:
        if "\x00" in self.command:  # no argv can hold one (the pattern above is schema only)
            raise ValueError("command: contains a NUL byte")
        for name in self.env or {}:
            if not re.fullmatch(ENV_NAME_PATTERN, name):
                raise ValueError(f"env: {name[:40]!r} is not a variable name")
        return self


class ProcessOutputArgs(_Args):
    process_id: str = _PROCESS_ID
    since: json_int(ge=0) | None = Field(None, description="Byte cursor: the `next` of the last answer. Default 0.")  # type: ignore[valid-type]
    wait_s: Annotated[float, Field(strict=True, ge=0, le=PROCESS_WAIT_MAX_S)] | None = Field(
        None, description="Wait up to this long for new output or the exit. Default 0."
    )
    max_bytes: json_int(ge=1, le=PROCESS_READ_MAX_BYTES) | None = Field(  # type: ignore[valid-type]
        None, description=f"At most this many bytes of output. Default {PROCESS_READ_MAX_BYTES}."
    )


class ProcessWriteArgs(_Args):
    process_id: str = _PROCESS_ID
    data: str = Field(..., max_length=PROCESS_WRITE_MAX, description="Text for its stdin (or keys for its terminal).")
    close_stdin: JsonBool = Field(False, description="Close its stdin after writing (end of input; not for a pty).")


class ProcessResizeArgs(_Args):
    process_id: str = _PROCESS_ID
    cols: json_int(ge=1, le=TERMINAL_MAX) = Field(..., description="Terminal width.")  # type: ignore[valid-type]
    rows: json_int(ge=1, le=TERMINAL_MAX) = Field(..., description="Terminal height.")  # type: ignore[valid-type]


class ProcessSignalArgs(_Args):
    process_id: str = _PROCESS_ID
    signal: Literal["TERM", "INT", "KILL", "HUP"] = Field(..., description="Sent to the whole process group.")


class ProcessListArgs(_Args):
    pass


# --- code kernels (sandbox_agent/kernels.py, docs/interpreter.md) -----------------------------

KERNEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DEFAULT_KERNEL = "default"
RUN_CODE_MAX = 1024 * 1024
KernelLanguage = Literal["python", "bash"]
_KERNEL_NAME = Field(
    None, pattern=KERNEL_NAME_PATTERN, max_length=64,
    description="A name to keep several kernels of one language apart in this session. Default: \"default\".",
)  # fmt: skip


class RunCodeArgs(_Args):
    code: str = Field(
        ...,
        min_length=1,
        max_length=RUN_CODE_MAX,
        description="The code to run (a notebook cell: python, or bash commands).",
        json_schema_extra={"pattern": r"^[^\x00]*$"},
    )
    language: KernelLanguage = Field("python", description="python (an IPython kernel) or bash (a persistent shell).")
    # The upper bound is the server's ORCH_TOOL_TIMEOUT_MAX_S, as for shell.
    timeout_s: Annotated[float, Field(strict=True, gt=0)] | None = Field(
        None, description="Seconds before the kernel is interrupted (its state survives)."
    )
    kernel: str | None = _KERNEL_NAME

    @model_validator(mode="after")
    def _no_nul(self) -> RunCodeArgs:
        if "\x00" in self.code:
            raise ValueError("code: contains a NUL byte")
        return self


class KernelSelectArgs(_Args):
    language: KernelLanguage | None = Field(None, description="python (default) or bash.")
    kernel: str | None = _KERNEL_NAME


class KernelRestartArgs(KernelSelectArgs):
    pass


class KernelShutdownArgs(KernelSelectArgs):
    pass


class KernelListArgs(_Args):
    pass


PROCESS_TOOL_NAMES = frozenset(
    {"process_start", "process_output", "process_write", "process_resize", "process_signal", "process_list"}
)


@dataclass(frozen=True)
class ContainerTool:
    """One tool the agent runs: its name, the arguments it validates and what a model is told
    about it. The one declaration of the container tools: the agent's tool table, the host's
    identity table and the host's tool registry (`GET /v1/tools`) are all derived from
    CONTAINER_TOOLS."""

    name: str
    arguments: type[_Args]
    description: str


_PATHS = (
    " Paths are absolute or relative to the working directory; only your own directories, the "
    "shared ones and your skills are reachable, and a refused path says why."
)

CONTAINER_TOOLS: tuple[ContainerTool, ...] = (
    ContainerTool(
        "read_file",
        ReadFileArgs,
        "Read a text file: up to `limit` lines (default 2000) from line `offset` (1-based). The result says "
        "how many lines the file has and where to continue; binary files are refused (use read_bytes)." + _PATHS,
    ),
    ContainerTool(
        "write_file",
        WriteFileArgs,
        "Create or replace a file with the given text, atomically; missing parent directories are created. "
        "Read-only places (skills) refuse with read_only." + _PATHS,
    ),
    ContainerTool(
        "write_bytes",
        WriteBytesArgs,
        "Create or replace a file with bytes that are not text (an image, an archive), given as base64 in "
        f"`content_base64` (at most {WRITE_BYTES_MAX} bytes decoded), atomically; missing parent directories "
        "are created. Same places and refusals as write_file." + _PATHS,
    ),
    ContainerTool(
        "edit_file",
        EditFileArgs,
        "Replace the exact text `old` with `new` in a file. `old` must occur exactly once: no match and "
        "several matches are errors that say which." + _PATHS,
    ),
    ContainerTool(
        "list_dir",
        ListDirArgs,
        "List a directory: names, types (file, dir, symlink with its target) and file sizes." + _PATHS,
    ),
    ContainerTool(
        "glob_search",
        GlobSearchArgs,
        "Find files whose path below `path` matches a glob (`*`, `?`, `[ab]`, `{a,b}`, `**` across "
        "directories), e.g. `**/*.py` or `skills/*/SKILL.md`." + _PATHS,
    ),
    ContainerTool(
        "grep_search",
        GrepSearchArgs,
        "Search text files for a regular expression, line by line; optionally only files matching `glob`. "
        "Returns path, line number and line text, up to a cap." + _PATHS,
    ),
    ContainerTool(
        "shell",
        ShellArgs,
        "Run a bash command in the working directory, with HOME set to your home directory. On timeout "
        "(timeout_s, default from the server) the whole process tree is killed and the output so far is "
        "returned with exit code 124. Processes do not outlive the call (use process_start for those). Long output keeps its head and tail "
        "around an 'N bytes omitted' marker and is saved in full to `stdout_file` / `stderr_file` (read it with "
        "read_file or grep_search); binary output is reported by size (`stdout_binary`).",
    ),
    ContainerTool(
        "read_bytes",
        ReadBytesArgs,
        "Read a file's raw bytes (base64), up to a size cap." + _PATHS,
    ),
    ContainerTool(
        "process_start",
        ProcessStartArgs,
        "Start a long-running command (a build, a test suite, a server, an interactive program) in the "
        "background and return at once with its `process_id`. It keeps running between calls; read its "
        "output with process_output, answer its prompts with process_write, stop it with process_signal. "
        "`pty: true` gives it a terminal.",
    ),
    ContainerTool(
        "process_output",
        ProcessOutputArgs,
        "Output of a background process after byte cursor `since` (pass the `next` of the previous answer), "
        "as ordered stdout/stderr chunks; `wait_s` waits for new output or the exit. `running` false and "
        "`exit_code` tell that it ended; `dropped_bytes` counts old output its bounded spool no longer holds.",
    ),
    ContainerTool(
        "process_write",
        ProcessWriteArgs,
        "Write text to a background process's stdin (or keys, control characters included, to its terminal).",
    ),
    ContainerTool(
        "process_resize",
        ProcessResizeArgs,
        "Resize the terminal of a background process started with `pty: true`.",
    ),
    ContainerTool(
        "process_signal",
        ProcessSignalArgs,
        "Send TERM, INT, KILL or HUP to a background process's whole process group.",
    ),
    ContainerTool(
        "process_list",
        ProcessListArgs,
        "List this session's background processes: command, state, exit code, output cursor, start time.",
    ),
    ContainerTool(
        "run_code",
        RunCodeArgs,
        "Run code in a kernel that keeps its state between calls: python (IPython: variables, imports, the "
        "cwd and open files survive; `%pip`, `%cd` work) or bash (cwd and exported variables survive). The "
        "kernel starts on first use in the working directory. Answers stdout, stderr, the last expression's "
        "`text` and rich `data` (html, markdown, json), each image shown (a matplotlib chart) as a file in the "
        "session's outputs/ directory (`images`: path, mime, size; post it with send_image), and an error's "
        "`ename`, `evalue` and `traceback`. Past timeout_s the kernel is interrupted (status `timeout`, its "
        "state kept); a kernel that died is restarted (`kernel_restarted`: its state is lost). Kernels are "
        "yours alone: in a group chat each speaker has their own, as with files.",
    ),
    ContainerTool(
        "kernel_restart",
        KernelRestartArgs,
        "Restart a kernel of this session (python by default): its variables and imports are gone.",
    ),
    ContainerTool(
        "kernel_shutdown",
        KernelShutdownArgs,
        "Shut down a kernel of this session (python by default) and everything it started.",
    ),
    ContainerTool(
        "kernel_list",
        KernelListArgs,
        "List your kernels of this session: name, language, start and last use.",
    ),
)

# Tools with a `timeout_s` of their own (bounded by the server's maximum; the host waits that
# long plus a margin) and tools whose output can be streamed as it comes (docs/processes.md).
TIMED_TOOLS = frozenset({"shell", "run_code"})
STREAMED_TOOLS = frozenset({"shell", "run_code"})
# A code kernel may have to start before its code runs (docs/interpreter.md).
KERNEL_START_MARGIN_S = 60.0

TOOL_ARGUMENTS: dict[str, type[_Args]] = {tool.name: tool.arguments for tool in CONTAINER_TOOLS}
CONTAINER_TOOL_NAMES = frozenset(TOOL_ARGUMENTS)


# --- configuration --------------------------------------------------------------------------


class RootConfig(BaseModel):
    """One allowed root of the PathSandbox (from the mount plan)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    access: Literal["ro", "rw"]
    purpose: str = ""


class AgentLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    output_cap_bytes: int = Field(256 * 1024, gt=0)
    # stdout and stderr of one shell call together, head and tail (tools/shell_output.py)
    shell_output_cap_bytes: int = Field(32 * 1024, ge=256)
    shell_spool_max_bytes: int = Field(64 * 1024 * 1024, ge=0)  # per session; 0: no spool
    read_bytes_max: int = Field(20 * 1024 * 1024, gt=0)
    shell_timeout_s: float = Field(60.0, gt=0)
    shell_timeout_max_s: float = Field(600.0, gt=0)
    read_file_default_lines: int = Field(2000, gt=0)
    list_max_entries: int = Field(1000, gt=0)
    glob_max_results: int = Field(1000, gt=0)
    grep_max_matches: int = Field(200, gt=0)
    grep_max_file_bytes: int = Field(8 * 1024 * 1024, gt=0)
    grep_timeout_s: float = Field(10.0, gt=0)
    walk_max_entries: int = Field(100_000, gt=0)
    process_max_count: int = Field(16, gt=0)  # running background processes of this sandbox
    process_spool_bytes: int = Field(8 * 1024 * 1024, ge=4096)  # the ring of each one
    process_max_runtime_s: float = Field(86400.0, gt=0)
    shell_stream_max_bytes: int = Field(8 * 1024 * 1024, ge=0)  # output events of one streamed shell
    kernels_max: int = Field(4, gt=0)  # code kernels of this sandbox at once (run_code)
    kernel_idle_s: float = Field(1800.0, gt=0)  # a kernel unused this long is shut down


# The per-agent token: `secrets.token_urlsafe(32)`. Both sides check the form before using
# one, so a file that holds anything else (a link to /proc/self/environ, a root-only file)
# is never sent, or accepted, as a token.
TOKEN_BYTES = 32
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{43}")


def valid_token(text: str) -> bool:
    return TOKEN_PATTERN.fullmatch(text) is not None


class EgressConfig(BaseModel):
    """The sandbox's way out (docs/egress.md): the agent's forwarder listens on
    127.0.0.1:`port` (0: any free port, where the network is the host's) and relays every
    connection to the orchestrator's proxy at `socket_path`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    socket_path: str
    port: int = Field(..., ge=0, lt=65536)
    ca_file: str | None = None  # the CA bundle pip and npm are told to trust
    # Pass each accepted connection to the proxy (SCM_RIGHTS) instead of relaying its bytes.
    # False under gVisor: a socket of its own network stack is no descriptor of the host's.
    hand_over: bool = True


class AgentConfig(BaseModel):
    """Everything an agent needs; written by the orchestrator (root) as JSON into the user's
    agent-secrets directory, which the sandbox can read but not write. It holds no secret:
    the token is read from `token_file` in the same directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    socket_path: str
    token_file: str
    # Also listen on 127.0.0.1:listen_port, the pod's own loopback: the kubernetes backend
    # reaches the agent through a port-forward of the Kubernetes API (docs/kubernetes.md).
    listen_port: int | None = Field(None, gt=0, lt=65536)
    user_id: int = Field(..., gt=0)
    data_root: str
    home: str
    tmp_dir: str
    roots: list[RootConfig]
    limits: AgentLimits = AgentLimits()
    # "auto": openat2 where the kernel has it, else the O_NOFOLLOW walk; the others force one.
    resolver: Literal["auto", "openat2", "walk"] = "auto"
    shell_env: dict[str, str] = Field(default_factory=dict)
    # Reported by /health so a starter can tell its own agent from a stale one.
    instance_id: str = ""
    # Exit when this process (the orchestrator, process backend) is gone; None in containers.
    parent_pid: int | None = None
    # RLIMIT_NPROC of the sandbox uid, set by the agent before it serves, so one user's fork
    # bomb cannot take the host's process table (None: the agent runs as the orchestrator's
    # own uid, which must not be limited).
    max_processes: int | None = Field(None, gt=0)
    # The agent's uid is this sandbox's alone (a sandbox uid): after the last call in flight
    # ends, every process of the uid that is not the agent's is a leftover and is killed. With
    # a uid it shares (the orchestrator's own, not root), only its adopted orphans are.
    sweep_uid: bool = False
    egress: EgressConfig | None = None  # None: egress off, no forwarder, no proxy settings
    # The dead-man switch: with no call for this long (and none in flight) the agent exits, and
    # its container stops, even when no orchestrator is left to stop it. None: never.
    idle_exit_s: float | None = Field(None, gt=0)
    # The python that runs code kernels (run_code): a name looked up on the shell's PATH, or
    # an absolute path. It needs ipykernel; the agent's own python never does.
    kernel_python: str = Field("python3", min_length=1, max_length=4096)


# --- envelopes ------------------------------------------------------------------------------


_CONTEXT_ID = Field(None, min_length=1, max_length=200)


class _CallIds(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str | None = _CONTEXT_ID
    session_id: str | None = _CONTEXT_ID


class CallContext(_CallIds):
    """What a call was made for: ending the run or deleting the session cancels it. The host
    also names the session's `shell-output/` directory (as the sandbox sees it), where a
    shell call spools output too long for its answer."""

    output_dir: str | None = Field(None, min_length=1, max_length=TOOL_PATH_MAX)
    # The session's `outputs/` directory, where run_code writes the images a kernel shows.
    outputs_dir: str | None = Field(None, min_length=1, max_length=TOOL_PATH_MAX)


class ToolRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    arguments: dict[str, Any] = Field(default_factory=dict)
    cwd: str = Field(..., description="Absolute working directory of the run; relative paths start here.")
    context: CallContext | None = None


class CancelRequest(_CallIds):
    """`POST /v1/calls/cancel`: the calls of this run, or of this session (at least one)."""

    @model_validator(mode="after")
    def _one_set(self) -> CancelRequest:
        if self.run_id is None and self.session_id is None:
            raise ValueError("name a run_id or a session_id")
        return self


class CancelResult(BaseModel):
    cancelled: int = Field(..., ge=0)  # calls stopped, and background processes of a cancelled session


class ErrorBody(BaseModel):
    """The structured error a model sees."""

    code: str
    message: str
    path: str | None = None


class ToolResponse(BaseModel):
    ok: bool
    result: Any = None
    error: ErrorBody | None = None


# A raw `read_bytes` answer carries its other fields here, as ASCII JSON (a file name that is
# not UTF-8 travels `\xNN`-escaped with `path_encoding: "escaped"`, like every other answer).
RAW_RESULT_HEADER = "X-Tool-Result"


class ReadBytesResult(BaseModel):
    """What `read_bytes` returns. Between agent and orchestrator the bytes travel raw (the body
    of an `application/octet-stream` answer; base64 in JSON cost ~19 ms per MiB in the agent);
    a model sees them as `content_base64` in JSON (`model_dump(mode="json")`)."""

    model_config = ConfigDict(frozen=True)

    path: str
    size: int = Field(..., ge=0)
    media_type: str
    data: bytes = Field(..., exclude=True, repr=False)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def content_base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    def raw_header(self) -> str:
        # A path that is not UTF-8 travels escaped (names.py), so the host can show and send it.
        return json.dumps(escape_names({"path": self.path, "size": self.size, "media_type": self.media_type}))

    @classmethod
    def from_raw(cls, header: str, data: bytes, *, spooled: int | None = None) -> ReadBytesResult:
        """From a raw answer (`spooled`: its bytes went to a sink, this many; `data` is then
        empty); ValueError when the header is unusable or the size disagrees."""
        try:
            fields = json.loads(header)
            result = cls(path=fields["path"], size=fields["size"], media_type=fields["media_type"], data=data)
        except (ValueError, TypeError, KeyError, ValidationError) as exc:
            raise ValueError(f"{RAW_RESULT_HEADER}: {exc}") from None
        _encodable(result)
        arrived = len(data) if spooled is None else spooled
        if result.size != arrived:
            raise ValueError(f"{arrived} bytes arrived, {result.size} announced")
        return result

    @classmethod
    def from_json_result(cls, result: Any) -> ReadBytesResult:
        """From the JSON form (an agent of an earlier BUILD); ValueError when unusable."""
        try:
            data = base64.b64decode(result["content_base64"], validate=True)
            return _encodable(cls(path=result["path"], size=len(data), media_type=result.get("media_type") or "", data=data))
        except (TypeError, KeyError, binascii.Error, ValidationError) as exc:
            raise ValueError(f"read_bytes answered without usable bytes: {exc!r}") from None


def _encodable(result: ReadBytesResult) -> ReadBytesResult:
    """The agent's fields as the host's answer will encode them: JSON may carry a lone
    surrogate ("\\udcff") that UTF-8 cannot, and a large answer is framed only after it was
    spooled (orchestrator/tools/read_bytes_stream.py), so such a result is refused here."""
    try:
        result.path.encode("utf-8")
        result.media_type.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"a field that is not valid Unicode ({exc.reason})") from None
    return result


class Health(BaseModel):
    build: str
    uptime_s: float
    busy: int
    user_id: int | None = None
    pid: int | None = None
    instance_id: str = ""
    resolver: str = ""
    processes: int = Field(0, ge=0)  # background processes running: the sandbox is busy
