"""The container tools: they run in the acting user's sandbox agent. Their
argument models are the wire models the agent validates with, so the schema `GET /v1/tools`
shows is exactly what the agent accepts."""

from __future__ import annotations

from sandbox_agent import wire

from orchestrator.tools.registry import ToolPlace, ToolRegistry, ToolSpec

_PATHS = (
    " Paths are absolute or relative to the working directory; only your own directories, the "
    "shared ones and your skills are reachable, and a refused path says why."
)

CONTAINER_TOOL_SPECS = (
    ToolSpec(
        "read_file",
        "Read a text file: up to `limit` lines (default 2000) from line `offset` (1-based). The result says "
        "how many lines the file has and where to continue; binary files are refused (use read_bytes)." + _PATHS,
        wire.ReadFileArgs,
        ToolPlace.CONTAINER,
    ),
    ToolSpec(
        "write_file",
        "Create or replace a file with the given text, atomically; missing parent directories are created. "
        "Read-only places (skills) refuse with read_only." + _PATHS,
        wire.WriteFileArgs,
        ToolPlace.CONTAINER,
    ),
    ToolSpec(
        "write_bytes",
        "Create or replace a file with bytes that are not text (an image, an archive), given as base64 in "
        f"`content_base64` (at most {wire.WRITE_BYTES_MAX} bytes decoded), atomically; missing parent directories "
        "are created. Same places and refusals as write_file." + _PATHS,
        wire.WriteBytesArgs,
        ToolPlace.CONTAINER,
    ),
    ToolSpec(
        "edit_file",
        "Replace the exact text `old` with `new` in a file. `old` must occur exactly once: no match and "
        "several matches are errors that say which." + _PATHS,
        wire.EditFileArgs,
        ToolPlace.CONTAINER,
    ),
    ToolSpec(
        "list_dir",
        "List a directory: names, types (file, dir, symlink with its target) and file sizes." + _PATHS,
        wire.ListDirArgs,
        ToolPlace.CONTAINER,
    ),
    ToolSpec(
        "glob_search",
        "Find files whose path below `path` matches a glob (`*`, `?`, `[ab]`, `{a,b}`, `**` across "
        "directories), e.g. `**/*.py` or `skills/*/SKILL.md`." + _PATHS,
        wire.GlobSearchArgs,
        ToolPlace.CONTAINER,
    ),
    ToolSpec(
        "grep_search",
        "Search text files for a regular expression, line by line; optionally only files matching `glob`. "
        "Returns path, line number and line text, up to a cap." + _PATHS,
        wire.GrepSearchArgs,
        ToolPlace.CONTAINER,
    ),
    ToolSpec(
        "shell",
        "Run a bash command in the working directory, with HOME set to your home directory. On timeout "
        "(timeout_s, default from the server) the whole process tree is killed and the output so far is "
        "returned with exit code 124. Processes do not outlive the call. Long output keeps its head and tail "
        "around an 'N bytes omitted' marker and is saved in full to `stdout_file` / `stderr_file` (read it with "
        "read_file or grep_search); binary output is reported by size (`stdout_binary`).",
        wire.ShellArgs,
        ToolPlace.CONTAINER,
    ),
    ToolSpec(
        "read_bytes",
        "Read a file's raw bytes (base64), up to a size cap." + _PATHS,
        wire.ReadBytesArgs,
        ToolPlace.CONTAINER,
    ),
)


def register_container_tools(registry: ToolRegistry) -> None:
    for spec in CONTAINER_TOOL_SPECS:
        registry.register(spec)
