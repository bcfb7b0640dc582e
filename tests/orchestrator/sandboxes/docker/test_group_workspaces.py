"""Group workspaces with every user in their own container: members' containers carry the
group's gid (`group_add`) and can edit each other's files; a non-member's container has no
such mount and no such gid; joining recreates the idle container with the new gid."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.orchestrator.sandboxes import test_group_workspaces as scenario

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.skipif(not scenario.AS_ROOT, reason="sandbox uids and gids need a root orchestrator"),
]


def group_add(service: OrchestratorService, user_id: int) -> set[int]:
    status = next(s for s in service.sandboxes.status() if s.user_id == user_id and s.state == "running")
    assert status.backend == "docker"
    container = service.sandboxes.backends.get("docker").client.containers.get(status.detail["container_id"])  # type: ignore[union-attr,index]
    return {int(g) for g in container.attrs["HostConfig"]["GroupAdd"] or []}


def test_members_share_and_strangers_are_refused(docker_client: TestClient, docker_service: OrchestratorService) -> None:
    scenario.members_share_and_strangers_are_refused(docker_client, docker_service)
    team_gid = docker_service.group_gids.gid_of(scenario.TEAM)
    assert team_gid in group_add(docker_service, scenario.ALICE)
    assert team_gid not in group_add(docker_service, scenario.CAROL)


def test_joining_recreates_the_idle_container_with_the_groups_gid(
    docker_client: TestClient, docker_service: OrchestratorService
) -> None:
    scenario.joining_gives_the_sandbox_the_new_gid(docker_client, docker_service)
    assert docker_service.group_gids.gid_of(scenario.TEAM) in group_add(docker_service, scenario.CAROL)


def test_item11_revoked_member_loses_the_workspace_on_the_next_call(
    docker_client: TestClient, docker_service: OrchestratorService
) -> None:
    scenario.revoking_takes_the_workspace_away_even_while_busy(docker_client, docker_service)
    assert docker_service.group_gids.gid_of(scenario.TEAM) not in group_add(docker_service, scenario.BOB)
