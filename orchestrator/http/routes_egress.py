"""Per-user egress changes (docs/egress.md): GET/PUT /v1/admin/users/{uid}/egress. A PUT
replaces the user's additions and removals and applies to their next connection."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.egress.service import EgressService
from orchestrator.egress.policy import MAX_PATTERNS, InvalidPattern, UserRules
from orchestrator.errors import InvalidInput, Unavailable
from orchestrator.http.auth import Caller, require_admin
from orchestrator.http.params import user_id_param
from orchestrator.http.parts import api_settings_of, egress_of
from orchestrator.settings import ApiSettings

router = APIRouter()

class EgressRulesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    allow: list[str] = Field(default_factory=list, max_length=MAX_PATTERNS, description="Patterns added for this user.")
    remove: list[str] = Field(
        default_factory=list, max_length=MAX_PATTERNS, description="Default patterns taken away for this user."
    )


class EgressRulesOut(BaseModel):
    user_id: int
    mode: str
    allow: list[str]
    remove: list[str]
    defaults: list[str]
    effective: list[str]


class EgressOff(Unavailable):
    code = "egress_off"


def _egress(egress: EgressService | None) -> EgressService:
    if egress is None:
        raise EgressOff("egress is off on this server (ORCH_EGRESS=off): sandboxes have no way out to change")
    return egress


def _out(egress: EgressService, api: ApiSettings, user_id: int) -> EgressRulesOut:
    rules = egress.rules.rules_of(user_id)
    return EgressRulesOut(
        user_id=user_id,
        mode=api.egress,
        allow=list(rules.allow),
        remove=list(rules.remove),
        defaults=[str(p) for p in egress.rules.defaults],
        effective=[str(p) for p in egress.rules.allow_for(user_id)],
    )


@router.get("/v1/admin/users/{user_id}/egress", response_model=EgressRulesOut, tags=["egress"])
def get_user_egress(
    user_id: int = Depends(user_id_param),
    egress: EgressService | None = Depends(egress_of),
    api: ApiSettings = Depends(api_settings_of),
    _: Caller = Depends(require_admin),
) -> EgressRulesOut:
    return _out(_egress(egress), api, user_id)


@router.put("/v1/admin/users/{user_id}/egress", response_model=EgressRulesOut, tags=["egress"])
def put_user_egress(
    body: EgressRulesIn,
    user_id: int = Depends(user_id_param),
    egress: EgressService | None = Depends(egress_of),
    api: ApiSettings = Depends(api_settings_of),
    caller: Caller = Depends(require_admin),
) -> EgressRulesOut:
    running = _egress(egress)
    try:
        running.rules.put(user_id, UserRules(tuple(body.allow), tuple(body.remove)), actor=caller.actor)
    except InvalidPattern as exc:
        raise InvalidInput(str(exc), field="allow") from None
    return _out(running, api, user_id)
