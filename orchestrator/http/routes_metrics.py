"""`GET /metrics`: the Prometheus text of `orchestrator.metrics`, behind the admin token (the
same bearer token as /v1/admin/*; docs/operations.md). On the API's own port: a second port
would be one more listener to secure and to document, and a scraper can send a bearer token."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from orchestrator import metrics
from orchestrator.http.auth import Caller, require_admin

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def prometheus_metrics(_caller: Caller = Depends(require_admin)) -> Response:
    # A plain `def`: the scrape lists the sandboxes (a Docker API call), so it runs in the
    # thread pool, never on the event loop.
    return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE)
