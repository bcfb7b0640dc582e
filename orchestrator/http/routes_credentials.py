"""Per-user credentials and their delegation grants (docs/credentials.md). Answers carry
metadata only: a secret goes in with a PUT and never comes out.

Who may: the admin token, or the bot acting for that very user (`X-Acting-User: {uid}`); the
bot without an acting user is refused, so a credential is never set or granted for someone
who did not ask. A grant is made by its grantor only, and revoked by its grantor or an admin.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from mounts import ids
from orchestrator.credentials.keys import CredentialsKeyRefused
from orchestrator.credentials.model import ENV_PATTERN, HEADER_PATTERN, MAX_HOSTS, MAX_SECRET_CHARS, NAME_PATTERN, TEMPLATE_PATTERN, Credential, Grant, InvalidCredential, validate_spec
from orchestrator.credentials.startup import configured_keys
from orchestrator.credentials.store import CredentialStore
from orchestrator.errors import Forbidden, InvalidInput, Unavailable
from orchestrator.http.acting import require_self
from orchestrator.http.auth import Caller, acting_user, require_admin, require_bot
from orchestrator.http.params import user_id_param
from orchestrator.http.parts import credential_settings_of, credentials_of, sessions_of
from orchestrator.sessions.service import SessionService
from orchestrator.settings import CredentialSettings

router = APIRouter()


class CredentialIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    secret: str = Field(..., min_length=1, max_length=MAX_SECRET_CHARS, description="The value; never returned.")
    hosts: list[str] = Field(..., min_length=1, max_length=MAX_HOSTS, description="Host patterns (egress rule syntax).")
    header: str = Field("Authorization", max_length=64, pattern=HEADER_PATTERN, description="The header it is sent in.")
    template: str = Field(
        "Bearer {secret}", max_length=200, pattern=TEMPLATE_PATTERN,
        description="The header's value: `{secret}`, or `{base64(LOGIN:secret)}` for Basic (`user`: the secret is user:password).",
    )  # fmt: skip
    env: str | None = Field(
        None, max_length=64, pattern=ENV_PATTERN, description="A variable set to the placeholder `cred:{name}` in the sandbox."
    )


class CredentialOut(BaseModel):
    name: str
    hosts: list[str]
    header: str
    env: str | None
    created_at: str
    last_used_at: str | None


class CredentialsOut(BaseModel):
    credentials: list[CredentialOut]


class GrantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    credential: str = Field(..., max_length=40)
    grantee_user_id: int | None = Field(
        ..., gt=0, le=ids.MAX_USER_ID, description="The runtime user whose runs may use it; null: every run of the session."
    )
    session_id: str = Field(..., max_length=128, json_schema_extra={"pattern": ids.SESSION_ID_PATTERN})
    ttl_s: int = Field(..., gt=0, description="Seconds until it expires (at most ORCH_GRANT_MAX_S).")


class GrantOut(BaseModel):
    grant_id: str
    credential: str
    grantor_user_id: int
    grantee_user_id: int | None
    session_id: str
    expires_at: str
    revoked_at: str | None = None


class GrantsOut(BaseModel):
    granted: list[GrantOut]
    held: list[GrantOut]


class RotationOut(BaseModel):
    credentials: int


class CredentialsOff(Unavailable):
    code = "credentials_off"


def _credentials(credentials: CredentialStore | None) -> CredentialStore:
    if credentials is None:
        raise CredentialsOff("credentials are off on this server: set ORCH_CREDENTIALS_KEY or ORCH_CREDENTIALS_KEY_FILE")
    return credentials


def require_for_user(caller: Caller, acting: int | None, user_id: int) -> None:
    """The admin, or the bot acting for `user_id` itself."""
    require_self(acting, user_id)
    if caller.role == "bot" and acting is None:
        raise Forbidden(
            f"the bot manages user {user_id}'s credentials only acting for that user (X-Acting-User: {user_id})",
            field="X-Acting-User",
        )


def credential_out(credential: Credential) -> CredentialOut:
    return CredentialOut(
        name=credential.name, hosts=list(credential.hosts), header=credential.header, env=credential.env,
        created_at=credential.created_at, last_used_at=credential.last_used_at,
    )  # fmt: skip


def grant_out(grant: Grant) -> GrantOut:
    return GrantOut(
        grant_id=grant.grant_id, credential=grant.credential, grantor_user_id=grant.grantor_user_id,
        grantee_user_id=grant.grantee_user_id, session_id=grant.session_id, expires_at=grant.expires_at,
        revoked_at=grant.revoked_at,
    )  # fmt: skip


def _name(name: str = Path(..., max_length=40, json_schema_extra={"pattern": NAME_PATTERN})) -> str:
    if not re.fullmatch(NAME_PATTERN, name):
        raise InvalidInput(f"a credential name is {NAME_PATTERN[1:-1]}", field="name")
    return name


@router.put("/v1/users/{user_id}/credentials/{name}", response_model=CredentialOut, tags=["credentials"])
def put_credential(
    body: CredentialIn,
    name: str = Depends(_name),
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    credentials: CredentialStore | None = Depends(credentials_of),
    caller: Caller = Depends(require_bot),
) -> CredentialOut:
    require_for_user(caller, acting, user_id)
    store = _credentials(credentials)
    try:
        spec = validate_spec(name, body.hosts, body.header, body.template, body.env, body.secret)
    except InvalidCredential as exc:
        raise InvalidInput(str(exc), field=exc.field) from None
    return credential_out(store.put(user_id, spec, body.secret, actor=caller.actor))


@router.get("/v1/users/{user_id}/credentials", response_model=CredentialsOut, tags=["credentials"])
def list_credentials(
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    credentials: CredentialStore | None = Depends(credentials_of),
    caller: Caller = Depends(require_bot),
) -> CredentialsOut:
    require_for_user(caller, acting, user_id)
    return CredentialsOut(credentials=[credential_out(c) for c in _credentials(credentials).list_metadata(user_id)])


@router.delete("/v1/users/{user_id}/credentials/{name}", status_code=204, tags=["credentials"])
def delete_credential(
    name: str = Depends(_name),
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    credentials: CredentialStore | None = Depends(credentials_of),
    caller: Caller = Depends(require_bot),
) -> Response:
    require_for_user(caller, acting, user_id)
    _credentials(credentials).delete(user_id, name, actor=caller.actor)
    return Response(status_code=204)


@router.post("/v1/users/{user_id}/grants", response_model=GrantOut, status_code=201, tags=["credentials"])
def post_grant(
    body: GrantIn,
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    credentials: CredentialStore | None = Depends(credentials_of),
    sessions: SessionService = Depends(sessions_of),
    caller: Caller = Depends(require_bot),
) -> GrantOut:
    """The grantor's own credential, for runs of one session (the grantor must see it)."""
    require_for_user(caller, acting, user_id)
    store = _credentials(credentials)
    sessions.get(body.session_id, acting_user=user_id)  # a session the grantor is not in: 404
    if body.grantee_user_id == user_id:
        raise InvalidInput("a user's own runs use its credentials without a grant", field="grantee_user_id")
    try:
        grant = store.grant(
            user_id, body.credential, grantee=body.grantee_user_id, session_id=body.session_id, ttl_s=body.ttl_s,
            actor=caller.actor if acting is None else f"{caller.actor}:acting:{acting}",
        )  # fmt: skip
    except InvalidCredential as exc:
        raise InvalidInput(str(exc), field=exc.field) from None
    return grant_out(grant)


@router.get("/v1/users/{user_id}/grants", response_model=GrantsOut, tags=["credentials"])
def list_grants(
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    credentials: CredentialStore | None = Depends(credentials_of),
    caller: Caller = Depends(require_bot),
) -> GrantsOut:
    require_for_user(caller, acting, user_id)
    found = _credentials(credentials).grants_of(user_id)
    return GrantsOut(granted=[grant_out(g) for g in found.granted], held=[grant_out(g) for g in found.held])


@router.delete("/v1/grants/{grant_id}", status_code=204, tags=["credentials"])
def delete_grant(
    grant_id: str = Path(..., max_length=64, pattern=r"^gr_[0-9a-f]{24}$"),
    acting: int | None = Depends(acting_user),
    credentials: CredentialStore | None = Depends(credentials_of),
    caller: Caller = Depends(require_bot),
) -> Response:
    store = _credentials(credentials)
    if caller.role == "bot" and acting is None:
        raise Forbidden("the bot revokes a grant only acting for its grantor (X-Acting-User)", field="X-Acting-User")
    store.revoke(grant_id, acting=acting, actor=caller.actor if acting is None else f"{caller.actor}:acting:{acting}")
    return Response(status_code=204)


@router.post("/v1/admin/credentials/rotate", response_model=RotationOut, tags=["credentials"])
def rotate_credentials_key(
    credentials: CredentialStore | None = Depends(credentials_of),
    settings: CredentialSettings = Depends(credential_settings_of),
    caller: Caller = Depends(require_admin),
) -> RotationOut:
    """Re-read the key setting (the key file: put the new key first, keep the old one after
    it) and re-encrypt every credential with the first key; no restart, nothing refused."""
    store = _credentials(credentials)
    try:
        keys = configured_keys(settings)
    except CredentialsKeyRefused as exc:
        raise InvalidInput(str(exc), field="ORCH_CREDENTIALS_KEY_FILE") from None
    if keys is None:
        raise InvalidInput("no credentials key is configured any more", field="ORCH_CREDENTIALS_KEY_FILE")
    try:
        count = store.rotate(keys, actor=caller.actor)
    except CredentialsKeyRefused as exc:
        raise InvalidInput(str(exc), field="ORCH_CREDENTIALS_KEY_FILE") from None
    return RotationOut(credentials=count)
