"""OpenAPI ``responses`` shared by several routes (so /docs lists every status a route can
answer with, and schema checks accept them)."""

from __future__ import annotations

from typing import Any

from ckptlab.backend.schemas import Message

__all__ = ["NOT_FOUND_RESPONSE", "WRITE_RESPONSES", "CSV_RESPONSE", "SSE_RESPONSE"]

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

SSE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: step, status, progress (sweeps) and a final end event",
        "content": {
            "text/event-stream": {
                "schema": {"type": "string"},
                "example": 'event: step\nid: 41:9f2c1a0b3d4e5f60\ndata: {"experiment_id":1,"attempt":1,"step":3,'
                '"step_ms":10.4}\n\n'
                'event: end\nid: 41:0c1d2e3f40516273\ndata: {"reason":"finished"}\n\n',
            }
        },
    }
}
