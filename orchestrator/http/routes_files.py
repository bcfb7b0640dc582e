"""Bytes leaving the service: public artifacts (`GET /uploads/{uid}/{file}`, no token) and
the outgoing deliveries `send_file` / `send_image` made for the chat bot."""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from orchestrator.errors import NotFound
from orchestrator.http.acting import check_delivery, visible_run
from orchestrator.http.auth import Caller, acting_user, require_bot
from orchestrator.http.models import FromRecord
from orchestrator.http.params import run_id_param
from orchestrator.http.parts import RunReach, deliveries_of, run_reach_of, uploads_of
from orchestrator.deliveries.outbox import DeliveryStore
from orchestrator.deliveries.public_uploads import INLINE_TYPES, PublishedUploads, iter_fd, upload_ref

router = APIRouter()


def _stream_and_close(fd: int) -> Iterator[bytes]:
    try:
        yield from iter_fd(fd)
    finally:
        os.close(fd)


def _disposition(kind: str, file_name: str) -> str:
    fallback = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in file_name)
    return f"{kind}; filename=\"{fallback}\"; filename*=UTF-8''{quote(file_name, safe='')}"


@router.head("/uploads/{user_id}/{file_name}", include_in_schema=False)
@router.get(
    "/uploads/{user_id}/{file_name}", tags=["uploads"], summary="A public artifact (no token; names are random UUIDs)"
)
def get_upload(
    request: Request,
    user_id: str = Path(..., max_length=20),
    file_name: str = Path(..., max_length=200),
    uploads: PublishedUploads = Depends(uploads_of),
) -> Response:
    # Everything that is not exactly one published, single-link regular file of that user's
    # sandbox uid is the same plain 404.
    ref = upload_ref(int(user_id), file_name) if user_id.isdigit() and not user_id.startswith("0") else None
    opened = uploads.open(ref) if ref is not None else None
    if opened is None:
        raise NotFound("no such upload")
    inline = opened.media_type in INLINE_TYPES
    headers = {
        "Content-Length": str(opened.size),
        "Content-Disposition": _disposition("inline" if inline else "attachment", file_name),
        "X-Content-Type-Options": "nosniff",
        # An uploaded page must never run as this origin.
        "Content-Security-Policy": "sandbox; default-src 'none'",
        "Cache-Control": "public, max-age=300",
    }
    if request.method == "HEAD":
        os.close(opened.fd)
        return Response(status_code=200, headers=headers, media_type=opened.media_type)
    return StreamingResponse(_stream_and_close(opened.fd), headers=headers, media_type=opened.media_type)


class DeliveryOut(FromRecord):
    delivery_id: str
    run_id: str
    session_id: str
    runtime_user_id: int
    tool: str
    kind: str
    file_name: str
    media_type: str
    size: int
    sha256: str
    source: str
    created_at: str
    expires_at: str
    fetched_at: str | None
    fetch: str = Field(validation_alias="fetch_path")


class DeliveryListOut(BaseModel):
    run_id: str
    deliveries: list[DeliveryOut]


class DeliveryDeletedOut(BaseModel):
    delivery_id: str
    deleted: bool


@router.get(
    "/v1/deliveries/{delivery_id}",
    tags=["deliveries"],
    summary="The bytes of an outgoing delivery (404 unknown, 410 expired)",
    response_class=Response,
)
def get_delivery(
    delivery_id: str = Path(..., max_length=100),
    acting: int | None = Depends(acting_user),
    deliveries: DeliveryStore = Depends(deliveries_of),
    reach: RunReach = Depends(run_reach_of),
    _: Caller = Depends(require_bot),
) -> Response:
    delivery = deliveries.get(delivery_id)
    check_delivery(reach, delivery.session_id, delivery_id, acting)
    fd = deliveries.open_bytes(delivery)
    headers = {
        "Content-Length": str(delivery.size),
        "Content-Disposition": _disposition("attachment", delivery.file_name),
        "X-Content-Type-Options": "nosniff",
        "X-Delivery-Id": delivery.delivery_id,
        "X-Delivery-Kind": delivery.kind,
        "X-Delivery-Sha256": delivery.sha256,
        "X-Session-Id": delivery.session_id,
        "X-Run-Id": delivery.run_id,
    }
    return StreamingResponse(_stream_and_close(fd), headers=headers, media_type=delivery.media_type)


@router.delete("/v1/deliveries/{delivery_id}", response_model=DeliveryDeletedOut, tags=["deliveries"])
def delete_delivery(
    delivery_id: str = Path(..., max_length=100),
    acting: int | None = Depends(acting_user),
    deliveries: DeliveryStore = Depends(deliveries_of),
    reach: RunReach = Depends(run_reach_of),
    _: Caller = Depends(require_bot),
) -> DeliveryDeletedOut:
    """The bot has posted it: free its bytes now instead of at expiry."""
    if acting is not None:
        check_delivery(reach, deliveries.get(delivery_id).session_id, delivery_id, acting)
    deliveries.delete(delivery_id)
    return DeliveryDeletedOut(delivery_id=delivery_id, deleted=True)


@router.get("/v1/runs/{run_id}/deliveries", response_model=DeliveryListOut, tags=["deliveries"])
def list_run_deliveries(
    run_id: str = Depends(run_id_param),
    acting: int | None = Depends(acting_user),
    reach: RunReach = Depends(run_reach_of),
    deliveries: DeliveryStore = Depends(deliveries_of),
    _: Caller = Depends(require_bot),
) -> DeliveryListOut:
    visible_run(reach, run_id, acting)  # 404 for an unknown (or invisible) run
    return DeliveryListOut(run_id=run_id, deliveries=[DeliveryOut.model_validate(d) for d in deliveries.list_for_run(run_id)])
