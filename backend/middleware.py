"""ASGI middleware of the API."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["BodySizeLimit", "AllowEveryMethod"]


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


class AllowEveryMethod:
    """Answer a method a documented path does not have (``OPTIONS``, ``PUT`` ...) with 405
    and an ``Allow`` header listing *every* method the path has (RFC 9110 §15.5.6).

    Starlette answers with the methods of the first route that matches the path only, so
    ``OPTIONS /api/experiments`` said ``Allow: POST`` although ``GET`` exists too. The
    paths and methods are read from the app's OpenAPI document (``paths``), so the header
    always agrees with the schema. CORS preflight requests (with ``Origin`` and
    ``Access-Control-Request-Method``) are left to the CORS middleware.

    Args:
        app: the ASGI app to wrap.
        openapi: returns the app's OpenAPI document (``FastAPI.openapi``).
    """

    def __init__(self, app: Any, *, openapi: Any):
        self.app = app
        self.openapi = openapi
        self._paths: list[tuple[re.Pattern[str], set[str]]] | None = None

    def _allowed(self, path: str) -> set[str]:
        if self._paths is None:
            self._paths = [
                (re.compile("^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)) + "$"), set(ops))
                for template, ops in self.openapi().get("paths", {}).items()
            ]
        allowed: set[str] = set()
        for pattern, ops in self._paths:
            if pattern.match(path):
                allowed |= {m.upper() for m in ops if m.lower() in _HTTP_METHODS}
        return allowed

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        preflight = b"origin" in headers and b"access-control-request-method" in headers
        allowed = self._allowed(scope["path"])
        if preflight or not allowed or scope["method"] in allowed:
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": "Method Not Allowed"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 405,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"allow", ", ".join(sorted(allowed)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


_HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
