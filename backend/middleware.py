"""ASGI middleware of the API."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["BodySizeLimit"]


class BodySizeLimit:
    """Answer 413 to a request whose body is larger than ``max_bytes``.

    A declared ``Content-Length`` over the limit is refused before anything is read; a
    chunked body is read up to the limit, then refused. Accepted bodies are passed on
    unchanged.

    Args:
        app: the ASGI app to wrap.
        max_bytes: the largest body accepted, bytes.
    """

    def __init__(self, app: Any, *, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared > self.max_bytes:
                await self._refuse(send)
                return
        # Read the body here (bounded), then replay it to the app.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # Disconnected before the body ended: let the app see it.
                await self.app(scope, _replay([message], receive), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        await self.app(scope, _replay(replay, receive), send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps(
            {"detail": f"request body is larger than this server's limit of {self.max_bytes} bytes"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _replay(messages: list[dict], receive: Any) -> Any:
    pending = list(messages)

    async def replayed() -> dict:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
