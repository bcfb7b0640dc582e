"""File and search tools on the PathSandbox (in process, both resolvers)."""

from __future__ import annotations

import base64
import os
import stat

import pytest

from sandbox_agent.errors import AgentToolError
from sandbox_agent.path_sandbox import PathSandbox
from sandbox_agent.tools.files import edit_file, read_bytes, read_file, write_file
from sandbox_agent.tools.search import glob_search, grep_search, list_dir
from sandbox_agent.wire import (
    EditFileArgs,
    GlobSearchArgs,
    GrepSearchArgs,
    ListDirArgs,
    ReadBytesArgs,
    ReadFileArgs,
    WriteFileArgs,
)
from tests.sandbox_agent.conftest import Tree, tool_context


def error_of(fn, *args) -> AgentToolError:  # type: ignore[no-untyped-def]
    with pytest.raises(AgentToolError) as info:
        fn(*args)
    return info.value


# --- read_file -----------------------------------------------------------------------------


def test_read_file_offset_limit_and_continuation(tree: Tree, sandbox: PathSandbox) -> None:
    (tree.workdir / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    ctx = tool_context(tree, sandbox)
    result = read_file(ctx, ReadFileArgs(path="n.txt", offset=10, limit=3))
    assert result["content"] == "line 10\nline 11\nline 12\n"
    assert (result["start_line"], result["end_line"], result["total_lines"]) == (10, 12, 100)
    assert result["next_offset"] == 13 and result["truncated"] is True
    whole = read_file(ctx, ReadFileArgs(path="n.txt"))
    assert whole["total_lines"] == 100 and whole["truncated"] is False and "next_offset" not in whole
    past = read_file(ctx, ReadFileArgs(path="n.txt", offset=500))
    assert past["content"] == "" and "only 100 lines" in past["note"]


def test_read_file_caps_bytes_and_shows_a_huge_line_partly(tree: Tree, sandbox: PathSandbox) -> None:
    (tree.workdir / "big.txt").write_text("x" * 5000 + "\nshort\n")
    result = read_file(tool_context(tree, sandbox, output_cap_bytes=1000), ReadFileArgs(path="big.txt"))
    assert result["content"] == "x" * 1000
    assert result["truncated"] is True and "output cap" in result["note"]
    assert result["total_lines"] == 2


def test_read_file_refuses_binary_files(tree: Tree, sandbox: PathSandbox) -> None:
    (tree.workdir / "img.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    error = error_of(read_file, tool_context(tree, sandbox), ReadFileArgs(path="img.bin"))
    assert error.code == "binary_file" and "read_bytes" in error.message


def test_read_file_without_final_newline_and_invalid_utf8(tree: Tree, sandbox: PathSandbox) -> None:
    (tree.workdir / "a.txt").write_bytes(b"one\ntwo \xff")
    result = read_file(tool_context(tree, sandbox), ReadFileArgs(path="a.txt"))
    assert result["total_lines"] == 2
    assert result["content"] == "one\ntwo \ufffd"


# --- write_file / edit_file ---------------------------------------------------------------


def test_write_file_creates_replaces_and_keeps_the_mode(tree: Tree, sandbox: PathSandbox) -> None:
    ctx = tool_context(tree, sandbox)
    assert write_file(ctx, WriteFileArgs(path="new/deep/f.txt", content="héllo"))["created"] is True
    assert (tree.workdir / "new/deep/f.txt").read_text() == "héllo"
    script = tree.workdir / "run.sh"
    script.write_text("old")
    os.chmod(script, 0o751)
    result = write_file(ctx, WriteFileArgs(path="run.sh", content="new"))
    assert result == {"path": str(script), "bytes_written": 3, "created": False}
    assert stat.S_IMODE(script.stat().st_mode) == 0o751
    assert [n for n in os.listdir(tree.workdir) if n.endswith(".tmp")] == []


def test_write_file_size_cap(tree: Tree, sandbox: PathSandbox) -> None:
    error = error_of(write_file, tool_context(tree, sandbox, read_bytes_max=10), WriteFileArgs(path="f", content="x" * 11))
    assert error.code == "too_large"
    assert not (tree.workdir / "f").exists()


def test_edit_file_exact_unique_replace(tree: Tree, sandbox: PathSandbox) -> None:
    target = tree.workdir / "code.py"
    target.write_text("a = 1\nb = 2\nc = 1\n")
    ctx = tool_context(tree, sandbox)
    assert edit_file(ctx, EditFileArgs(path="code.py", old="b = 2", new="b = 3")) == {
        "path": str(target), "replacements": 1, "line": 2,
    }
    assert target.read_text() == "a = 1\nb = 3\nc = 1\n"
    none = error_of(edit_file, ctx, EditFileArgs(path="code.py", old="zzz", new="y"))
    assert none.code == "no_match"
    several = error_of(edit_file, ctx, EditFileArgs(path="code.py", old="= 1", new="= 9"))
    assert several.code == "ambiguous_match"
    assert "2 times" in several.message and "lines 1, 3" in several.message
    assert target.read_text() == "a = 1\nb = 3\nc = 1\n"
    assert error_of(edit_file, ctx, EditFileArgs(path="missing.py", old="a", new="b")).code == "not_found"
    assert error_of(edit_file, ctx, EditFileArgs(path="skills/foo/SKILL.md", old="foo", new="x")).code == "read_only"


# --- read_bytes -----------------------------------------------------------------------------


def test_read_bytes_and_its_cap(tree: Tree, sandbox: PathSandbox) -> None:
    (tree.workdir / "img.png").write_bytes(b"\x89PNG\x00\x01")
    result = read_bytes(tool_context(tree, sandbox), ReadBytesArgs(path="img.png"))
    assert result.data == b"\x89PNG\x00\x01" and base64.b64decode(result.content_base64) == result.data
    assert result.media_type == "image/png" and result.size == 6
    error = error_of(read_bytes, tool_context(tree, sandbox, read_bytes_max=5), ReadBytesArgs(path="img.png"))
    assert error.code == "too_large"


# --- list_dir / glob_search / grep_search ------------------------------------------------


def test_list_dir_types_sizes_links_and_cap(tree: Tree, sandbox: PathSandbox) -> None:
    ctx = tool_context(tree, sandbox)
    result = list_dir(ctx, ListDirArgs(path="."))
    assert result["path"] == str(tree.workdir)
    assert result["entries"] == [
        {"name": "hello.txt", "type": "file", "size": 12},
        {"name": "skills", "type": "dir"},
    ]
    for i in range(5):
        (tree.workdir / f"f{i}").touch()
    capped = list_dir(tool_context(tree, sandbox, list_max_entries=3), ListDirArgs(path="."))
    assert len(capped["entries"]) == 3 and capped["total"] == 7 and capped["truncated"] is True


def test_glob_follows_skill_links_inside_the_roots_but_not_outside(tree: Tree, sandbox: PathSandbox) -> None:
    os.symlink(tree.data / "outside", tree.workdir / "out")
    os.symlink(tree.workdir, tree.workdir / "loop")  # a loop back to the workdir
    (tree.workdir / "docs").mkdir()
    (tree.workdir / "docs" / "guide.md").write_text("guide")
    ctx = tool_context(tree, sandbox)
    result = glob_search(ctx, GlobSearchArgs(pattern="**/*.md"))
    assert result["matches"] == [
        str(tree.workdir / "docs/guide.md"),
        str(tree.workdir / "skills/foo/SKILL.md"),
    ]
    assert glob_search(ctx, GlobSearchArgs(pattern="skills/*/SKILL.md"))["matches"] == [
        str(tree.workdir / "skills/foo/SKILL.md")
    ]
    assert glob_search(ctx, GlobSearchArgs(pattern="**/secret.txt"))["matches"] == []
    assert error_of(glob_search, ctx, GlobSearchArgs(pattern="../*")).code == "invalid_arguments"
    assert error_of(glob_search, ctx, GlobSearchArgs(pattern="*", path="../../18")).code == "foreign_runtime_path"


def test_glob_caps(tree: Tree, sandbox: PathSandbox) -> None:
    for i in range(20):
        (tree.workdir / f"{i:02d}.log").touch()
    result = glob_search(tool_context(tree, sandbox, glob_max_results=5), GlobSearchArgs(pattern="*.log"))
    assert len(result["matches"]) == 5 and result["truncated"] is True
    walked = glob_search(tool_context(tree, sandbox, walk_max_entries=4), GlobSearchArgs(pattern="**/*.log"))
    assert walked["truncated"] is True and "Stopped after visiting" in walked["note"]


def test_grep_regex_glob_caps_and_binary_skip(tree: Tree, sandbox: PathSandbox) -> None:
    (tree.workdir / "src").mkdir()
    (tree.workdir / "src" / "a.py").write_text("import os\nx = 1  # TODO fix\n")
    (tree.workdir / "src" / "b.txt").write_text("TODO in text\n")
    (tree.workdir / "blob.bin").write_bytes(b"TODO\x00\x01")
    os.symlink(tree.data / "outside" / "secret.txt", tree.workdir / "leak.txt")
    (tree.data / "outside" / "secret.txt").write_text("TODO outside\n")
    ctx = tool_context(tree, sandbox)
    result = grep_search(ctx, GrepSearchArgs(pattern=r"TODO\b"))
    assert [(m["path"], m["line"]) for m in result["matches"]] == [
        (str(tree.workdir / "src/a.py"), 2),
        (str(tree.workdir / "src/b.txt"), 1),
    ]
    only_py = grep_search(ctx, GrepSearchArgs(pattern="TODO", glob="*.py"))
    assert [m["path"] for m in only_py["matches"]] == [str(tree.workdir / "src/a.py")]
    single = grep_search(ctx, GrepSearchArgs(pattern="^import", path="src/a.py"))
    assert single["matches"] == [{"path": str(tree.workdir / "src/a.py"), "line": 1, "text": "import os"}]
    in_skill = grep_search(ctx, GrepSearchArgs(pattern="foo skill"))
    assert [m["path"] for m in in_skill["matches"]] == [str(tree.workdir / "skills/foo/SKILL.md")]
    assert error_of(grep_search, ctx, GrepSearchArgs(pattern="(")).code == "invalid_arguments"
    (tree.workdir / "many.txt").write_text("hit\n" * 50)
    capped = grep_search(tool_context(tree, sandbox, grep_max_matches=7), GrepSearchArgs(pattern="hit"))
    assert len(capped["matches"]) == 7 and capped["truncated"] is True


def test_every_path_tool_gives_the_same_diagnostic(tree: Tree, sandbox: PathSandbox) -> None:
    ctx = tool_context(tree, sandbox)
    foreign = str(tree.p("runtime/18/s9/secret.txt"))
    folder = str(tree.p("runtime/18/s9"))
    calls = [
        (read_file, ReadFileArgs(path=foreign)),
        (read_bytes, ReadBytesArgs(path=foreign)),
        (write_file, WriteFileArgs(path=foreign, content="x")),
        (edit_file, EditFileArgs(path=foreign, old="1", new="2")),
        (list_dir, ListDirArgs(path=folder)),
        (glob_search, GlobSearchArgs(pattern="*", path=folder)),
        (grep_search, GrepSearchArgs(pattern="x", path=folder)),
    ]
    messages = set()
    for fn, args in calls:
        error = error_of(fn, ctx, args)
        assert error.code == "foreign_runtime_path", fn.__name__
        messages.add(error.message.rsplit(": ", 1)[0])
    assert len(messages) == 1
    assert (tree.p("runtime/18/s9/secret.txt")).read_text() == "18's secret\n"
