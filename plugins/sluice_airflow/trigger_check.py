"""The backfill's and the redrive's trigger check: bad backfill (or redrive) params are refused by the API server
when the run is triggered, in the trigger form or as the REST answer, not half a minute later in the ``plan`` task's
log.

Airflow checks each param against its own JSON Schema when a run is triggered (``SerializedParamsDict.validate`` in
``create_dagrun``; a failure is the trigger route's HTTP 400), and the backfill form's schema says what a schema can
(:func:`sluice_airflow.backfill_dag.backfill_params`). A rule across params (an end after its start, a range the
stream allows, a mode the stream takes) is no schema's, and Airflow has no hook for it at trigger time; a plugin's
root middleware (``fastapi_root_middlewares``) sees the trigger request first. This one runs the planner's own
validation (:func:`sluice.operations.backfill.parse_request`: plain Python over the catalog, no I/O) on a trigger of
the backfill DAG (the redrive's own, :func:`sluice.operations.redrive.parse_request`, on a trigger of the redrive DAG)
by a caller Airflow knows, and answers a refusal as Airflow answers a schema's: HTTP 400 with one
line in ``detail``. Any other request, and a caller without a valid token, pass through untouched, so that Airflow
answers them (401, 403, 404) as it would without Sluice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from sluice.errors import SluiceError, printable
from sluice.operations.backfill import DAG_ID as BACKFILL_DAG_ID
from sluice.operations.backfill import parse_request
from sluice.operations.redrive import DAG_ID as REDRIVE_DAG_ID

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The public trigger route of the backfill and redrive DAGs, as the UI's form and REST callers post to it (under any
# base path).
_TRIGGER = re.compile(rf"(^|/)api/v2/dags/({BACKFILL_DAG_ID}|{REDRIVE_DAG_ID})/dagRuns/?$")
# A trigger's body is a few params; one larger than this is left to Airflow to refuse or read.
MAX_BODY_BYTES = 1 << 20
REFUSED = "backfill refused, nothing was read or written"
REDRIVE_REFUSED = "redrive refused, nothing was read or written"


class BackfillTriggerCheck:
    """ASGI middleware: a trigger of the backfill (or redrive) DAG whose params the planner refuses gets HTTP 400 at
    once."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = _TRIGGER.search(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        body, more = await _read_body(receive)
        refusal = None if more else await _refusal(scope, body, found.group(2))
        if refusal is not None:
            await _answer(send, 400, {"detail": refusal})
            return
        await self.app(scope, _replay(body, more, receive), send)


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request's body up to :data:`MAX_BODY_BYTES`, and whether more follows unread."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if not message.get("more_body", False):
            return b"".join(chunks), False
        if size > MAX_BODY_BYTES:
            return b"".join(chunks), True


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """The body read so far for the app behind, then the rest of the request as it comes."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replay


async def _answer(send: Send, status: int, payload: dict[str, Any]) -> None:
    content = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]})
    await send({"type": "http.response.body", "body": content})


async def _refusal(scope: Scope, body: bytes, dag_id: str = BACKFILL_DAG_ID) -> str | None:
    """The one line that refuses the trigger, or None to let Airflow handle it (a body that is no trigger's, a
    caller Airflow does not know or who may not trigger the DAG, params the planner takes)."""
    try:
        payload = json.loads(body or b"{}")
    except ValueError:
        return None
    conf = payload.get("conf") if isinstance(payload, dict) else None
    if conf is None:
        conf = {}
    if not isinstance(conf, dict) or not await _may_trigger(scope, dag_id):
        return None
    from sluice.catalog import cached_catalog
    from sluice.operations import redrive

    check, refused = (redrive.parse_request, REDRIVE_REFUSED) if dag_id == REDRIVE_DAG_ID else (parse_request,
                                                                                                REFUSED)
    try:
        catalog = cached_catalog()
        streams = [stream.name for stream in catalog]
        defaults = {name: param.value for name, param in _params(streams, dag_id).items() if _has_default(param)}
        check({**defaults, **conf}, catalog, run_id="trigger-check")
    except SluiceError as exc:
        return printable(f"{refused}: {exc}")
    return None


def _params(streams: list[str], dag_id: str = BACKFILL_DAG_ID) -> dict[str, Any]:
    if dag_id == REDRIVE_DAG_ID:
        from sluice_airflow.redrive_dag import redrive_params

        return redrive_params(streams)
    from sluice_airflow.backfill_dag import backfill_params

    return backfill_params(streams)


def _has_default(param: Any) -> bool:
    from airflow.sdk.definitions._internal.types import is_arg_set

    return bool(is_arg_set(param.value))


async def _may_trigger(scope: Scope, dag_id: str = BACKFILL_DAG_ID) -> bool:
    """Whether the caller's token (bearer, or the UI's session cookie) is valid and may trigger the DAG."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.api_fastapi.core_api.security import resolve_user_from_token
    from fastapi import HTTPException
    from starlette.requests import Request

    request = Request(scope)
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    token = credentials if scheme.lower() == "bearer" else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    try:
        user = await resolve_user_from_token(token)
    except HTTPException:
        return False
    return bool(get_auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN,
                                                     details=DagDetails(id=dag_id), user=user))
