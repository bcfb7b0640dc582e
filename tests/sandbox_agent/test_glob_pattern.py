from __future__ import annotations

import pytest

from sandbox_agent.glob_pattern import GlobError, compile_glob


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("*.py", ["a.py", ".hidden.py"], ["a/b.py", "a.pyc", "py"]),
        ("**/*.py", ["a.py", "a/b.py", "a/b/c.py"], ["a.txt", "a/b.txt"]),
        ("src/**", ["src/a", "src/a/b"], ["srcx/a", "a/src/b"]),
        ("a/**/b.md", ["a/b.md", "a/x/b.md", "a/x/y/b.md"], ["b.md", "ab.md", "a/xb.md"]),
        ("skills/*/SKILL.md", ["skills/foo/SKILL.md"], ["skills/SKILL.md", "skills/a/b/SKILL.md"]),
        ("?.txt", ["a.txt"], ["ab.txt", "/.txt"]),
        ("[ab]*.txt", ["a1.txt", "b.txt"], ["c.txt"]),
        ("[!ab]*.txt", ["c.txt"], ["a.txt"]),
        ("*.{js,ts}", ["x.js", "y.ts"], ["z.py", "x.jsx"]),
        ("a+b(c).txt", ["a+b(c).txt"], ["aab(c).txt"]),
        ("./*.md", ["x.md"], ["d/x.md"]),
    ],
)
def test_matching(pattern: str, yes: list[str], no: list[str]) -> None:
    glob = compile_glob(pattern)
    for path in yes:
        assert glob.matches(path), (pattern, path)
    for path in no:
        assert not glob.matches(path), (pattern, path)


def test_depth_bounds_the_walk() -> None:
    assert compile_glob("*.py").max_depth == 0
    assert compile_glob("a/*/c.py").max_depth == 2
    assert compile_glob("**/x").max_depth is None


def test_a_plain_name_glob_matches_at_any_depth_for_grep() -> None:
    glob = compile_glob("*.py", name_only_when_plain=True)
    assert glob.matches("a/b/c.py") and glob.max_depth is None
    assert not compile_glob("src/*.py", name_only_when_plain=True).matches("x/src/a.py")


@pytest.mark.parametrize("pattern", ["", "/etc/*", "../*", "a/../../b", "\x00"])
def test_invalid_patterns(pattern: str) -> None:
    with pytest.raises(GlobError):
        compile_glob(pattern)
