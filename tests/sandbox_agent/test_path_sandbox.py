"""The traversal corpus: every case runs against both resolvers (openat2 and the
O_NOFOLLOW walk). A refusal must be the right structured error and change nothing."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path

import pytest

from sandbox_agent.errors import AgentToolError
from sandbox_agent.path_sandbox import PathSandbox, Root
from tests.sandbox_agent.conftest import USER, Tree


def refused(sandbox: PathSandbox, path: str, cwd: str, *, write: bool = False) -> AgentToolError:
    with pytest.raises(AgentToolError) as info:
        if write:
            sandbox.write_target(path, cwd).close()
        else:
            sandbox.open_file(path, cwd).close()
    return info.value


def read(sandbox: PathSandbox, path: str, cwd: str) -> bytes:
    with sandbox.open_file(path, cwd) as opened:
        return os.read(opened.fd, 1 << 16)


def test_plain_reads_relative_and_absolute(sandbox: PathSandbox, tree: Tree) -> None:
    cwd = str(tree.workdir)
    assert read(sandbox, "hello.txt", cwd) == b"hello\nworld\n"
    assert read(sandbox, str(tree.workdir / "hello.txt"), "/") == b"hello\nworld\n"
    assert read(sandbox, "./skills/../hello.txt", cwd) == b"hello\nworld\n"  # `..` inside a root is fine
    with sandbox.open_file("hello.txt", cwd) as opened:
        assert opened.path == str(tree.workdir / "hello.txt")
        assert opened.root.purpose == "runtime"


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("../../18/s9/secret.txt", "foreign_runtime_path"),
        ("../../../runtime/18/s9/secret.txt", "foreign_runtime_path"),
        ("../../../outside/secret.txt", "path_escape"),
        ("../" * 30 + "etc/passwd", "path_escape"),
        ("/etc/passwd", "path_escape"),
        ("/proc/self/root/etc/passwd", "path_escape"),
        ("/proc/self/cwd", "path_escape"),
        ("../../", "path_escape"),
        ("../..", "path_escape"),
    ],
)
def test_dot_dot_and_absolute_escapes(sandbox: PathSandbox, tree: Tree, path: str, code: str) -> None:
    error = refused(sandbox, path, str(tree.workdir))
    assert error.code == code
    assert error.path is not None and error.path in error.message


def test_another_users_upload_is_diagnosed(sandbox: PathSandbox, tree: Tree) -> None:
    error = refused(sandbox, str(tree.p("uploads/18/x.png")), str(tree.workdir))
    assert error.code == "foreign_upload_path"
    assert f"(current runtime identity {USER})" in error.message


@pytest.mark.parametrize("path", ["", "a\x00b", "\x00"])
def test_empty_and_nul(sandbox: PathSandbox, tree: Tree, path: str) -> None:
    assert refused(sandbox, path, str(tree.workdir)).code == "invalid_arguments"
    assert refused(sandbox, path, str(tree.workdir), write=True).code == "invalid_arguments"


def test_very_long_names_and_paths(sandbox: PathSandbox, tree: Tree) -> None:
    cwd = str(tree.workdir)
    longest = "n" * 255
    with sandbox.write_target(longest, cwd) as target:
        assert target.name == longest
    assert refused(sandbox, "n" * 256, cwd).code == "invalid_arguments"
    assert refused(sandbox, "é" * 128, cwd).code == "invalid_arguments"  # 256 bytes in UTF-8
    assert refused(sandbox, "a/" * 2100 + "x", cwd).code == "invalid_arguments"  # > PATH_MAX
    assert refused(sandbox, "\udcff\ud800", cwd).code == "invalid_arguments"
    assert refused(sandbox, "/\ud800", "/").code == "invalid_arguments"  # short and absolute too


LEVEL = "ddddddddd"  # nine bytes and a slash a level: ~400 levels make a path of 4,000 bytes


def deep_tree(top: Path, levels: int, files_at: dict[int, str]) -> None:
    """`levels` nested directories below `top`, made name by name on directory fds (the kernel
    makes any depth that way), with a file at the levels `files_at` names."""
    fd = os.open(top, os.O_PATH | os.O_DIRECTORY)
    try:
        for level in range(1, levels + 1):
            os.mkdir(LEVEL, dir_fd=fd)
            below = os.open(LEVEL, os.O_PATH | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
            if level in files_at:
                file_fd = os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(file_fd, files_at[level].encode())
                os.close(file_fd)
    finally:
        os.close(fd)


def kernel_opens(path: str, cwd: str) -> bool:
    """The oracle: whether open(2) takes `path` from `cwd` (ENAMETOOLONG or not)."""
    dir_fd = os.open(cwd, os.O_PATH | os.O_DIRECTORY)
    try:
        os.close(os.open(path, os.O_RDONLY, dir_fd=dir_fd))
        return True
    except OSError as exc:
        assert exc.errno == errno.ENAMETOOLONG, exc
        return False
    finally:
        os.close(dir_fd)


def test_a_path_the_kernel_opens_is_served_and_a_longer_one_refused_with_its_path(
    sandbox: PathSandbox, tree: Tree
) -> None:
    cwd = str(tree.workdir)
    near = (4000 - len(cwd)) // (len(LEVEL) + 1)  # the level whose file is ~4,000 bytes away from /
    deep_tree(tree.workdir, 405, {near: "near the limit\n", 405: "past it, from the root\n"})
    absolute = cwd + f"/{LEVEL}" * near + "/f.txt"
    relative = f"{LEVEL}/" * 405 + "f.txt"  # 4,055 bytes; with the cwd in front, more than PATH_MAX
    too_long = cwd + "/" + relative
    assert 3990 <= len(absolute.encode()) <= 4095 and kernel_opens(absolute, "/")
    assert kernel_opens(relative, cwd) and len(too_long.encode()) > 4095 and not kernel_opens(too_long, "/")

    assert read(sandbox, absolute, "/") == b"near the limit\n"
    assert read(sandbox, relative, cwd) == b"past it, from the root\n"
    with sandbox.write_target(absolute[: -len("f.txt")] + "new.txt", "/") as target:
        assert target.existing is None and target.root.purpose == "runtime"

    for write in (False, True):
        error = refused(sandbox, too_long, "/", write=write)
        assert error.code == "invalid_arguments" and "4095 bytes" in error.message
        assert error.path == too_long[:200] + "..."


def test_unicode_names_work(sandbox: PathSandbox, tree: Tree) -> None:
    (tree.workdir / "résumé 文件.txt").write_text("ok")
    assert read(sandbox, "résumé 文件.txt", str(tree.workdir)) == b"ok"


def test_symlink_chain_longer_than_path_max_resolves_inside(sandbox: PathSandbox, tree: Tree) -> None:
    """30 absolute links of ~200-byte names: the expanded path is far beyond PATH_MAX, yet each
    hop is short, so it resolves — to the right file, never outside."""
    chain = tree.workdir / "chain"
    chain.mkdir()
    names = [f"{i:02d}" + "x" * 200 for i in range(30)]
    for i, name in enumerate(names):
        target = chain / names[i + 1] if i + 1 < len(names) else tree.workdir / "hello.txt"
        os.symlink(target, chain / name)
    assert sum(len(str(chain / n)) for n in names) > 4096
    assert read(sandbox, f"chain/{names[0]}", str(tree.workdir)) == b"hello\nworld\n"


def test_symlink_chain_over_forty_hops_is_a_loop(sandbox: PathSandbox, tree: Tree) -> None:
    for i in range(45):
        os.symlink(f"l{i + 1}", tree.workdir / f"l{i}")
    (tree.workdir / "l45").write_text("end")
    assert refused(sandbox, "l0", str(tree.workdir)).code == "symlink_loop"
    assert read(sandbox, "l10", str(tree.workdir)) == b"end"  # 35 hops are fine


@pytest.mark.parametrize(
    "links",
    [
        {"a": "a"},
        {"a": "b", "b": "a"},
        {"a": "sub/../a"},
    ],
)
def test_symlink_loops(sandbox: PathSandbox, tree: Tree, links: dict[str, str]) -> None:
    (tree.workdir / "sub").mkdir()
    for name, target in links.items():
        os.symlink(target, tree.workdir / name)
    assert refused(sandbox, "a", str(tree.workdir)).code == "symlink_loop"
    assert refused(sandbox, "a/x", str(tree.workdir), write=True).code == "symlink_loop"


def test_prefix_confusion_uploads_1_vs_10(tree: Tree, resolver: str) -> None:
    (tree.p("uploads/10/mine.txt")).write_text("10's")
    (tree.p("uploads/1/mine.txt")).write_text("1's")
    sb = PathSandbox([Root(str(tree.p("uploads/1")), True, "uploads")], data_root=str(tree.data), user_id=1, resolver=resolver)  # type: ignore[arg-type]
    try:
        assert read(sb, str(tree.p("uploads/1/mine.txt")), "/") == b"1's"
        error = refused(sb, str(tree.p("uploads/10/mine.txt")), "/")
        assert error.code == "foreign_upload_path"
        assert refused(sb, str(tree.p("uploads/1")) + "0/mine.txt", "/").code == "foreign_upload_path"
    finally:
        sb.close()


def test_cve_2025_53110_sibling_with_a_common_prefix(sandbox: PathSandbox, tree: Tree) -> None:
    """The filesystem MCP server allowed `/allowed_dir_sensitive` because it starts with `/allowed_dir`."""
    (tree.data / "share_sensitive").mkdir()
    (tree.data / "share_sensitive" / "creds").write_text("secret")
    assert refused(sandbox, str(tree.data / "share_sensitive" / "creds"), "/").code == "path_escape"
    assert refused(sandbox, str(tree.data / "share_sensitive" / "new"), "/", write=True).code == "path_escape"
    assert not (tree.data / "share_sensitive" / "new").exists()
    assert refused(sandbox, str(tree.data / "runtime/17") + "_x/f", "/").code == "path_escape"


def test_cve_2025_53109_symlink_to_outside_cannot_be_read_or_created_through(sandbox: PathSandbox, tree: Tree) -> None:
    """The MCP server followed a link whose target did not exist yet and created the file outside."""
    cwd = str(tree.workdir)
    os.symlink(tree.data / "outside" / "planted.txt", tree.workdir / "dangling")
    os.symlink(tree.data / "outside", tree.workdir / "out")
    os.symlink("../../../outside/planted2.txt", tree.workdir / "dangling_rel")
    for path in ["dangling", "out/new.txt", "out/deeper/new.txt", "dangling_rel"]:
        assert refused(sandbox, path, cwd, write=True).code == "path_escape", path
    assert refused(sandbox, "out/secret.txt", cwd).code == "path_escape"
    assert sorted(os.listdir(tree.data / "outside")) == ["secret.txt"]


@pytest.mark.parametrize("suffix", ["../", "./../", "s1/../../", "s1/../../.", "../.", "s1/../..//"])
def test_go_cve_2025_22873_trailing_dot_dot_slash(sandbox: PathSandbox, tree: Tree, suffix: str) -> None:
    """Go's os.Root opened the parent directory for names ending in `../`."""
    root = str(tree.p("runtime/17"))
    with pytest.raises(AgentToolError) as info:
        sandbox.open_dir(f"{root}/{suffix}", "/").close()
    assert info.value.code == "path_escape"
    with pytest.raises(AgentToolError) as info:
        sandbox.open_dir(suffix, root).close()
    assert info.value.code == "path_escape"


def test_trailing_slash_on_a_file(sandbox: PathSandbox, tree: Tree) -> None:
    assert refused(sandbox, "hello.txt/", str(tree.workdir)).code == "not_a_directory"
    assert refused(sandbox, "newdir/", str(tree.workdir), write=True).code == "is_a_directory"


def test_relative_symlink_leaving_its_root(sandbox: PathSandbox, tree: Tree) -> None:
    os.symlink("../../../outside", tree.workdir / "rel")
    os.symlink("../../18/s9", tree.workdir / "rel18")
    cwd = str(tree.workdir)
    assert refused(sandbox, "rel/secret.txt", cwd).code == "path_escape"
    assert refused(sandbox, "rel18/secret.txt", cwd).code == "foreign_runtime_path"


def test_symlink_into_another_allowed_root_is_followed(sandbox: PathSandbox, tree: Tree) -> None:
    cwd = str(tree.workdir)
    assert read(sandbox, "skills/foo/SKILL.md", cwd) == b"# foo skill\n"
    with sandbox.open_file("skills/foo/SKILL.md", cwd) as opened:
        assert opened.root.purpose == "skill_views"
        assert opened.path == str(tree.workdir / "skills/foo/SKILL.md")  # as the model named it
    # `..` after a link is physical: it leaves the link's target, not the link's directory.
    assert read(sandbox, "skills/foo/../foo/SKILL.md", cwd) == b"# foo skill\n"
    # a relative link inside the view root and an absolute link into share both work
    os.symlink("foo/SKILL.md", tree.p("skill-views/17/alias"))
    assert read(sandbox, str(tree.p("skill-views/17/alias")), "/") == b"# foo skill\n"
    (tree.p("share/note.txt")).write_text("shared")
    os.symlink(tree.p("share"), tree.workdir / "to_share")
    assert read(sandbox, "to_share/note.txt", cwd) == b"shared"


def test_writes_land_only_in_read_write_roots(sandbox: PathSandbox, tree: Tree) -> None:
    cwd = str(tree.workdir)
    for path in ["skills/foo/SKILL.md", "skills/foo/new.md", "skills/foo/sub/new.md", str(tree.p("skill-views/17/x"))]:
        error = refused(sandbox, path, cwd, write=True)
        assert error.code == "read_only", path
        assert "read-only" in error.message
    assert sorted(os.listdir(tree.p("skill-views/17/foo"))) == ["SKILL.md"]
    # a link to a share file is written through (both roots are rw)
    os.symlink(tree.p("share/target.txt"), tree.workdir / "to_target")
    with sandbox.write_target("to_target", cwd) as target:
        assert target.root.purpose == "share"
        assert target.name == "target.txt"


def test_write_creates_missing_parents_inside_the_root_only(sandbox: PathSandbox, tree: Tree) -> None:
    cwd = str(tree.workdir)
    with sandbox.write_target("a/b/c/file.txt", cwd) as target:
        assert target.existing is None
    assert (tree.workdir / "a/b/c").is_dir()
    os.symlink(tree.data / "outside", tree.workdir / "o")
    assert refused(sandbox, "o/new/deeper/file.txt", cwd, write=True).code == "path_escape"
    assert not (tree.data / "outside" / "new").exists()


def test_root_itself_and_directories_are_not_files(sandbox: PathSandbox, tree: Tree) -> None:
    assert refused(sandbox, str(tree.p("runtime/17")), "/", write=True).code == "is_a_directory"
    assert refused(sandbox, "skills", str(tree.workdir)).code == "is_a_directory"
    assert refused(sandbox, "skills", str(tree.workdir), write=True).code == "is_a_directory"


def test_fifo_is_refused_without_hanging(sandbox: PathSandbox, tree: Tree) -> None:
    os.mkfifo(tree.workdir / "pipe")
    assert refused(sandbox, "pipe", str(tree.workdir)).code == "not_a_regular_file"


def test_missing_things(sandbox: PathSandbox, tree: Tree) -> None:
    assert refused(sandbox, "nope.txt", str(tree.workdir)).code == "not_found"
    assert refused(sandbox, "hello.txt/x", str(tree.workdir)).code == "not_a_directory"


def test_a_missing_root_answers_not_found(tree: Tree, resolver: str) -> None:
    sb = PathSandbox([Root(str(tree.p("userskills/17")), False, "userskills")], data_root=str(tree.data), user_id=17, resolver=resolver)  # type: ignore[arg-type]
    try:
        assert refused(sb, str(tree.p("userskills/17/x")), "/").code == "not_found"
    finally:
        sb.close()


def test_hard_links_share_content_but_writes_replace_only_their_name(sandbox: PathSandbox, tree: Tree) -> None:
    """A hard link is the same file, not a path escape; but a write through one name gets a new
    inode (temp + rename), so the other name — e.g. a skill view file hard-linked from the
    content store — keeps its bytes."""
    from sandbox_agent.tools.context import ToolContext
    from sandbox_agent.tools.files import write_file
    from sandbox_agent.wire import AgentConfig, WriteFileArgs

    view_file = tree.p("skill-views/17/foo/SKILL.md")
    os.link(view_file, tree.workdir / "linked.md")
    assert read(sandbox, "linked.md", str(tree.workdir)) == b"# foo skill\n"
    config = AgentConfig(
        socket_path="/nonexistent", token_file="/nonexistent", user_id=17, data_root=str(tree.data),
        home=str(tree.p("users/17")), tmp_dir="/tmp", roots=[],
    )
    write_file(ToolContext(sandbox, config, str(tree.workdir)), WriteFileArgs(path="linked.md", content="changed"))
    assert view_file.read_text() == "# foo skill\n"
    assert (tree.workdir / "linked.md").read_text() == "changed"
    assert os.stat(view_file).st_nlink == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as an unprivileged uid")
def test_a_sandbox_uid_cannot_hard_link_a_file_it_does_not_own(traversable_tmp: Path) -> None:
    """Hard links can smuggle an outside file into a root only for files the uid owns: the
    kernel's protected_hardlinks forbids linking others' files (and containers mount separately)."""
    if Path("/proc/sys/fs/protected_hardlinks").read_text().strip() != "1":
        pytest.skip("fs.protected_hardlinks is off on this host")
    secret = traversable_tmp / "root-secret"
    secret.write_text("root only")
    os.chmod(secret, 0o644)
    mine = traversable_tmp / "mine"
    mine.mkdir()
    os.chown(mine, 100017, 100017)
    result = subprocess.run(
        ["/usr/bin/python3", "-c", f"import os; os.link({str(secret)!r}, {str(mine / 'l')!r})"],
        user=100017, group=100017, capture_output=True, text=True,
    )
    assert result.returncode != 0
    assert "PermissionError" in result.stderr or "Operation not permitted" in result.stderr


def test_a_root_above_the_data_dir_does_not_claim_paths_inside_it(tree: Tree, resolver: str) -> None:
    """In a sandbox, /tmp is an allowed root; when the data dir lives below it (tests do), a
    foreign path under the data dir must still be diagnosed, not looked up inside /tmp."""
    above = tree.data.parent
    sb = PathSandbox(
        [Root(str(above), True, "tmp"), Root(str(tree.p("runtime/17")), True, "runtime")],
        data_root=str(tree.data), user_id=17, resolver=resolver,  # type: ignore[arg-type]
    )
    try:
        assert refused(sb, str(tree.p("runtime/18/s9/secret.txt")), "/").code == "foreign_runtime_path"
        assert refused(sb, str(tree.data / "outside" / "secret.txt"), "/").code == "path_escape"
        assert read(sb, "hello.txt", str(tree.workdir)) == b"hello\nworld\n"
        (above / "scratch.txt").write_text("tmp file")
        assert read(sb, str(above / "scratch.txt"), "/") == b"tmp file"
    finally:
        sb.close()


def test_links_in_a_shared_root_resolve_only_within_it(sandbox: PathSandbox, tree: Tree) -> None:
    """Issue 12, item 7: anybody can plant a link in `share/`; it may not lead into the
    user's private roots, however it is spelled, while links inside `share/` work."""
    share, home = tree.p("share"), tree.p("users/17")
    (home / "secret").write_text("17's secret\n")
    (share / "sub").mkdir()
    (share / "real.txt").write_text("shared\n")
    for name, target in [
        ("abs", str(home / "secret")),
        ("homedir", str(home)),
        ("rel", "../users/17/secret"),
        ("sub/deep", "../../users/17/secret"),
        ("sneaky", f"{share}/../users/17/secret"),  # absolute, names share/, climbs out
        ("rc", str(home / ".bashrc")),  # dangling: a write would create it
        ("newdir", f"{home}/new/file"),
    ]:
        os.symlink(target, share / name)
    os.symlink(str(share / "real.txt"), share / "sub/inside")
    os.symlink("../real.txt", share / "sub/up")
    os.symlink(str(share), tree.workdir / "my-share")  # the user's own link into share/
    cwd = str(tree.workdir)
    for path in ("abs", "homedir/secret", "rel", "sub/deep", "sneaky"):
        error = refused(sandbox, f"{share}/{path}", cwd)
        assert error.code == "symlink_escape", (path, error.code)
        assert str(share) in error.message and error.path == f"{share}/{path}"
    assert refused(sandbox, "my-share/abs", cwd).code == "symlink_escape"  # reached through one's own link
    for path in (f"{share}/rc", f"{share}/newdir", f"{share}/homedir/.profile", "my-share/rc"):
        assert refused(sandbox, path, cwd, write=True).code == "symlink_escape", path
    assert not (home / ".bashrc").exists() and not (home / "new").exists() and not (home / ".profile").exists()
    for path in (f"{share}/sub/inside", f"{share}/sub/up", "my-share/real.txt", "my-share/sub/up"):
        assert read(sandbox, path, cwd) == b"shared\n"
    with sandbox.write_target(f"{share}/sub/up", cwd) as target:
        assert target.root.purpose == "share" and target.name == "real.txt"
    assert read(sandbox, "skills/foo/SKILL.md", cwd) == b"# foo skill\n"  # private links still cross roots


@pytest.mark.parametrize("target", ["hello.txt/", "hello.txt/.", "./hello.txt/"])
def test_a_link_whose_target_ends_in_a_slash_names_a_directory(sandbox: PathSandbox, tree: Tree, target: str) -> None:
    """As the kernel has it: `link -> file/` is "not a directory", in both resolvers; a planted
    link must not make the walk read a file the path says is a directory."""
    os.symlink(target, tree.workdir / "slashed")
    assert refused(sandbox, "slashed", str(tree.workdir)).code == "not_a_directory"
    os.symlink("skills/", tree.workdir / "to-dir")
    with sandbox.open_dir("to-dir", str(tree.workdir)) as opened:
        assert stat.S_ISDIR(os.fstat(opened.fd).st_mode)
