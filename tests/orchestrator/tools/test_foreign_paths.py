"""The host's lexical pre-check: a pure decision, no disk, no sandbox."""

from __future__ import annotations

import pytest

from orchestrator.tools.foreign_paths import (
    FOREIGN_RUNTIME,
    FOREIGN_UPLOAD,
    absolute_path,
    classify_foreign_path,
    foreign_path_message,
)

DATA = "/srv/orch/data"
WORKDIR = f"{DATA}/runtime/67/s-1"
BASE = "https://bot.example.com/orch"


def classify(path: str, user: int = 67):
    return classify_foreign_path(path, workdir=WORKDIR, data_root=DATA, runtime_user_id=user, public_base_url=BASE)


def test_another_members_upload_gets_its_full_public_url() -> None:
    found = classify(f"{DATA}/uploads/17/3f2a.png")
    assert found is not None
    assert found.code == FOREIGN_UPLOAD
    assert found.owner_user_id == 17
    assert found.public_url == "https://bot.example.com/orch/uploads/17/3f2a.png"
    message = foreign_path_message(found, 67, tool="send_file")
    assert "current runtime identity 67" in message
    assert "pass this URL to send_file instead: https://bot.example.com/orch/uploads/17/3f2a.png" in message


def test_another_members_runtime_file_has_no_url_and_suggests_the_member_or_the_group_workspace() -> None:
    found = classify(f"{DATA}/runtime/17/s-1/report.md")
    assert found is not None and found.code == FOREIGN_RUNTIME and found.public_url is None
    message = foreign_path_message(found, 67, tool="send_file")
    assert "http" not in message
    assert "no public URL" in message
    assert "that member" in message and "group workspace" in message
    assert found.path in message


@pytest.mark.parametrize(
    "path",
    [
        "../../../uploads/17/a.png",  # relative to the workdir
        "../../17/s-1/../../../uploads/17/a.png",
        f"{DATA}/runtime/67/s-1/../../../uploads/17/a.png",
        f"//{DATA.lstrip('/')}/uploads/17/a.png",
        f"{DATA}/./uploads//17/a.png",
    ],
)
def test_relative_and_unnormalized_paths_are_resolved_lexically_against_the_workdir(path: str) -> None:
    found = classify(path)
    assert found is not None and found.code == FOREIGN_UPLOAD
    assert found.path == f"{DATA}/uploads/17/a.png"
    assert found.public_url == f"{BASE}/uploads/17/a.png"


def test_a_relative_path_into_another_runtime_dir() -> None:
    found = classify("../../17/s-1/out.txt")
    assert found is not None and found.code == FOREIGN_RUNTIME and found.owner_user_id == 17


@pytest.mark.parametrize(
    "path",
    [
        "report.md",
        f"{WORKDIR}/report.md",
        f"{DATA}/uploads/67/mine.png",  # the runtime user's own upload
        f"{DATA}/runtime/67/other-session/x",
        f"{DATA}/share/x",
        f"{DATA}/groups/feishu/oc_1/x",
        f"{DATA}/users/17/.bashrc",  # not a category of the pre-check: the sandbox decides
        f"{DATA}/uploads",
        f"{DATA}/uploadsX/17/a.png",  # prefix confusion
        f"{DATA}/uploads/017/a.png",  # not how the layout names user 17
        f"{DATA}/uploads/abc/a.png",
        "/etc/passwd",
        "/srv/orch/data-old/uploads/17/a.png",
    ],
)
def test_everything_else_is_left_to_the_sandbox(path: str) -> None:
    assert classify(path) is None


def test_prefix_confusion_between_user_ids() -> None:
    assert classify(f"{DATA}/uploads/1/a.png", user=10) is not None
    assert classify(f"{DATA}/uploads/10/a.png", user=1) is not None
    assert classify(f"{DATA}/uploads/10/a.png", user=10) is None


@pytest.mark.parametrize("rest", ["sub/a.png", ".hidden", ""])
def test_an_upload_path_that_has_no_public_url_says_so(rest: str) -> None:
    path = f"{DATA}/uploads/17/{rest}" if rest else f"{DATA}/uploads/17"
    found = classify(path)
    assert found is not None and found.code == FOREIGN_UPLOAD and found.public_url is None
    message = foreign_path_message(found, 67, tool="send_file")
    assert "no public URL" in message and "http" not in message


def test_publish_artifact_is_told_the_file_is_already_public() -> None:
    found = classify(f"{DATA}/uploads/17/a.png")
    message = foreign_path_message(found, 67, tool="publish_artifact")
    assert "already published" in message and f"{BASE}/uploads/17/a.png" in message


def test_url_file_names_are_percent_encoded_and_the_base_url_slash_is_not_doubled() -> None:
    found = classify_foreign_path(
        f"{DATA}/uploads/17/a_b-c.1.png", workdir=WORKDIR, data_root=DATA, runtime_user_id=67,
        public_base_url="http://127.0.0.1:8700/",
    )
    assert found.public_url == "http://127.0.0.1:8700/uploads/17/a_b-c.1.png"


def test_absolute_path() -> None:
    assert absolute_path("a/../b", "/w") == "/w/b"
    assert absolute_path("/x/../../y", "/w") == "/y"
    assert absolute_path("//x", "/w") == "/x"
