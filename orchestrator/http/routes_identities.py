"""People named by their chat platform: `/v1/identities/{platform}/{external_id}`, and the
admin's view and links (orchestrator/users/identities.py, docs/bots.md "Platform identities")."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Response

from mounts import ids
from orchestrator.errors import Forbidden, InvalidInput, NotFound
from orchestrator.http.acting import require_self
from orchestrator.http.auth import Caller, acting_user, require_admin, require_bot
from orchestrator.http.models import IdentityIn, IdentityLinkIn, IdentityListOut, IdentityOut
from orchestrator.http.parts import identities_of
from orchestrator.users.identities import IdentityRecord, IdentityRepository, PlatformIdentity

router = APIRouter()

LIST_MAX = 500


async def identity_param(
    platform: str = Path(..., max_length=32, json_schema_extra={"pattern": ids.PLATFORM_PATTERN}),
    external_id: str = Path(..., max_length=ids.MAX_EXTERNAL_ID_CHARS, json_schema_extra={"pattern": ids.EXTERNAL_ID_PATTERN}),
) -> PlatformIdentity:
    try:
        return PlatformIdentity(ids.platform(platform, "platform"), ids.external_id(external_id, "external_id"))
    except ids.InvalidIdentifier as exc:
        raise InvalidInput(exc.message, field=exc.field) from None


def _out(record: IdentityRecord) -> IdentityOut:
    return IdentityOut(
        user_id=record.user_id, platform=record.platform, external_id=record.external_id, display_name=record.display_name
    )


@router.put("/v1/identities/{platform}/{external_id}", response_model=IdentityOut, tags=["users"])
def put_identity(
    body: IdentityIn | None = None,
    identity: PlatformIdentity = Depends(identity_param),
    acting: int | None = Depends(acting_user),
    identities: IdentityRepository = Depends(identities_of),
    caller: Caller = Depends(require_bot),
) -> IdentityOut:
    """The person's user id, allocated on the first sighting and the same on every repeat. A
    `display_name` becomes the user's."""
    if acting is not None:
        existing = identities.get(identity)
        if existing is None:
            raise Forbidden(
                f"X-Acting-User {acting} may name itself only, not a new person", field="X-Acting-User"
            )
        require_self(acting, existing.user_id)
    record = identities.sight(identity, display_name=(body or IdentityIn()).display_name, actor=caller.actor)
    return _out(record)


@router.get("/v1/identities/{platform}/{external_id}", response_model=IdentityOut, tags=["users"])
def get_identity(
    identity: PlatformIdentity = Depends(identity_param),
    acting: int | None = Depends(acting_user),
    identities: IdentityRepository = Depends(identities_of),
    _: Caller = Depends(require_bot),
) -> IdentityOut:
    record = identities.get(identity)
    if record is None or (acting is not None and acting != record.user_id):
        raise NotFound(f"no user is known as {identity.header_value()}", field="external_id")
    return _out(record)


@router.put("/v1/admin/identities/{platform}/{external_id}", response_model=IdentityOut, tags=["admin"])
def link_identity(
    body: IdentityLinkIn,
    response: Response,
    identity: PlatformIdentity = Depends(identity_param),
    identities: IdentityRepository = Depends(identities_of),
    caller: Caller = Depends(require_admin),
) -> IdentityOut:
    """Admin: one more platform identity for an existing user (the same person on another
    platform). 201 when linked now, 200 when it already named that user, 409 when it names
    another user (an identity is never moved: it would move a person's files)."""
    record, created = identities.link(identity, body.user_id, actor=caller.actor)
    response.status_code = 201 if created else 200
    return _out(record)


@router.get("/v1/admin/identities", response_model=IdentityListOut, tags=["admin"])
def list_identities(
    platform: str | None = Query(None, max_length=32),
    user_id: int | None = Query(None, gt=0, le=ids.MAX_USER_ID),
    after: str | None = Query(None, max_length=200, description="the previous page's `next_after`"),
    limit: int = Query(100, ge=1, le=LIST_MAX),
    identities: IdentityRepository = Depends(identities_of),
    _: Caller = Depends(require_admin),
) -> IdentityListOut:
    """The mapping from platform identities to user ids, ordered by `{platform}:{id}`."""
    if platform is not None:
        platform = ids.platform(platform, "platform")
    records = identities.list(platform=platform, user_id=user_id, limit=limit + 1, after=after)
    more = len(records) > limit
    page = records[:limit]
    return IdentityListOut(
        identities=[_out(r) for r in page],
        next_after=page[-1].identity.header_value() if more and page else None,
    )
