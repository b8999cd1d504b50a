"""OpenAPI ``responses`` shared by several routes (so /docs lists every status a route can
answer with, and schema checks accept them)."""

from __future__ import annotations

from typing import Any

from ckptlab.backend.schemas import Message
from ckptlab.backend.services.streams import EVENT_DATA, LAST_EVENT_ID_PATTERN

__all__ = [
    "NOT_FOUND_RESPONSE",
    "WRITE_RESPONSES",
    "CSV_RESPONSE",
    "SSE_RESPONSE",
    "SSE_MEDIA_TYPE",
    "BUSY_RESPONSE",
    "DATABASE_BUSY",
    "retry_later",
]

#: Why any route that reads or writes the database may answer 503 (``ckptlab.backend.app``).
DATABASE_BUSY = "the database is busy (locked past its busy timeout) or unreachable; nothing was changed"


def retry_later(why: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI entry of a 503 with ``Retry-After`` (seconds), answered when ``why``."""
    retry_after = {
        "description": "seconds to wait before sending it again",
        "required": True,
        "schema": {"type": "integer"},
    }
    return {503: {"model": Message, "description": f"Retry later: {why}", "headers": {"Retry-After": retry_after}}}


#: The 503 of every route (documented once, on the ``/api`` router).
BUSY_RESPONSE = retry_later(DATABASE_BUSY)

NOT_FOUND_RESPONSE: dict[int | str, dict[str, Any]] = {404: {"model": Message, "description": "No such id"}}

#: Statuses any write route may answer with besides its own.
WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": Message, "description": "The body could not be read as JSON text (e.g. it is not UTF-8)"},
    401: {"model": Message, "description": "The server has an API token and the request did not bring it"},
    413: {"model": Message, "description": "The request body is larger than the server's max_request_bytes"},
}

CSV_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "JSON, or with format=csv a CSV download (Content-Disposition: attachment)",
        "content": {"text/csv": {"schema": {"type": "string"}, "example": "id,status\n1,succeeded\n"}},
    }
}

#: A live stream's media type: a route whose 200 is documented with it is a stream (its
#: requests count against the server's ``max_streams``: ``ckptlab.backend.middleware.StreamCap``).
SSE_MEDIA_TYPE = "text/event-stream"


def _event(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of one event of type ``kind`` whose ``data`` is JSON of schema ``data``."""
    json_data = {"type": "string", "contentMediaType": "application/json", "contentSchema": data}
    fields = {"event": {"const": kind}, "id": {"type": "string", "pattern": LAST_EVENT_ID_PATTERN}, "data": json_data}
    return {"type": "object", "required": ["event", "id", "data"], "properties": fields}


#: A live stream's answers. Its 200 schema is one event (Open API 3.1 reads an event
#: stream's schema as each event's: ``event``, ``id``, ``data`` as text), the ``data``
#: JSON of each type stated with ``contentSchema``.
SSE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: step, status, progress (sweeps) and a final end event, each "
        "with an id to resume after (Last-Event-ID) and its data as one line of JSON",
        "content": {
            SSE_MEDIA_TYPE: {
                "schema": {"oneOf": [_event(kind, data) for kind, data in EVENT_DATA.items()]},
                "example": {
                    "event": "step",
                    "id": "41:9f2c1a0b3d4e5f60",
                    "data": '{"experiment_id":1,"attempt":1,"step":3,"step_ms":10.4}',
                },
            }
        },
    },
    **retry_later(f"the server already serves max_streams live streams, or {DATABASE_BUSY}"),
}
