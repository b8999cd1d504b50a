"""ASGI middleware of the API."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import numpy as np

__all__ = [
    "BodySizeLimit",
    "AllowEveryMethod",
    "WriteGuard",
    "CatchErrors",
    "StreamSlots",
    "StreamCap",
    "path_pattern",
    "json_nesting_depth",
    "MAX_JSON_DEPTH",
    "INTERNAL_ERROR",
]

log = logging.getLogger(__name__)

#: The body of a 500: the details are in the server's log, not in the answer.
INTERNAL_ERROR = "internal server error; the server logged it"

#: Deepest nesting of arrays and objects a JSON body may have. A spec is 3 levels deep and a
#: sweep 5; parsers, validators and error renderers recurse once per level, so a body
#: nested ~1,000 deep would hit Python's recursion limit (a 500) before this.
MAX_JSON_DEPTH = 32

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_OPENER_CODES = np.frombuffer(b"[{", dtype=np.uint8)


def json_nesting_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, without parsing it.

    Strings are cut out first (brackets inside them do not count), then the running sum of
    ``+1`` per ``[``/``{`` and ``-1`` per ``]``/``}`` is taken with numpy, so the cost is
    linear in ``len(body)`` and nothing recurses. A malformed text may read deeper than it
    is; it is refused by the parser in any case.

    Args:
        body: the raw request body, bytes.

    Returns:
        0 for a scalar, 1 for ``[1]`` or ``{}``, 2 for ``[[1]]``, ...
    """
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = np.where(np.isin(np.frombuffer(brackets, dtype=np.uint8), _OPENER_CODES), 1, -1)
    return int(np.cumsum(steps).max())


class BodySizeLimit:
    """Answer 413 to a request whose body is larger than ``max_bytes``, and 422 to a JSON body
    nested deeper than ``max_depth``.

    A declared ``Content-Length`` over the limit is refused before anything is read; a
    chunked body is read up to the limit, then refused. The nesting is measured by
    :func:`json_nesting_depth` (no recursion) before any parser sees the body, so no
    handler down the line can run out of stack. Accepted bodies are passed on unchanged.

    Args:
        app: the ASGI app to wrap.
        max_bytes: the largest body accepted, bytes.
        max_depth: the deepest JSON nesting accepted (default :data:`MAX_JSON_DEPTH`).
    """

    def __init__(self, app: Any, *, max_bytes: int, max_depth: int = MAX_JSON_DEPTH):
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth

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
        whole = b"".join(chunks)
        if whole and json_nesting_depth(whole) > self.max_depth:
            detail = [
                {
                    "type": "json_too_deep",
                    "loc": ["body"],
                    "msg": f"JSON is nested deeper than this server's limit of {self.max_depth} levels",
                    "input": None,
                }
            ]
            await _send_json(send, 422, {"detail": detail})
            return
        replay = [{"type": "http.request", "body": whole, "more_body": False}]
        await self.app(scope, _replay(replay, receive), send)

    async def _refuse(self, send: Any) -> None:
        detail = f"request body is larger than this server's limit of {self.max_bytes} bytes"
        await _send_json(send, 413, {"detail": detail})


async def _send_json(send: Any, status: int, content: Any, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(content).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


#: Methods that change state: the API's writes.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class WriteGuard:
    """Refuse writes another web site makes the user's browser send (cross-site request
    forgery), whether or not an API token is set.

    For a write (POST, PUT, PATCH, DELETE):

    - **Origin.** When the request has an ``Origin`` header (browsers send one with every
      request whose method is not GET or HEAD: Fetch standard, "origin header"), or else a
      ``Referer``, its ``host[:port]`` must be the request's own ``Host`` (the same server,
      whatever the scheme a TLS proxy in front adds) or the origin must be one of
      ``allowed_origins``; otherwise 403. ``Origin: null`` (a sandboxed frame, a file) is
      refused. A request with neither header is not a browser's cross-site request (curl,
      scripts) and passes.
    - **Content type.** A write that declares a ``Content-Type`` must declare
      ``application/json``, and one with a body must declare it; otherwise 415. So no
      "simple" cross-site request (``text/plain``, form encodings: no CORS preflight) can
      reach a route, and a body-less ``POST .../cancel`` from curl still works.

    Reads pass untouched: the ``Host`` check (Starlette's ``TrustedHostMiddleware``, added by
    :func:`ckptlab.backend.app.create_app`) is what keeps DNS rebinding from reading them.

    Args:
        app: the ASGI app to wrap.
        allowed_origins: full origins (``scheme://host[:port]``) trusted besides the server's
            own (the settings' ``cors_origins``).
    """

    def __init__(self, app: Any, *, allowed_origins: list[str]):
        self.app = app
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}

    def _origin_refusal(self, headers: dict[bytes, bytes]) -> str | None:
        source = headers.get(b"origin") or headers.get(b"referer")
        if source is None:
            return None
        text = source.decode("latin-1").strip()
        parts = urlsplit(text)
        origin = f"{parts.scheme}://{parts.netloc}".lower()
        own = headers.get(b"host", b"").decode("latin-1").lower()
        if parts.scheme in ("http", "https") and (parts.netloc.lower() == own or origin in self.allowed_origins):
            return None
        return (
            f"cross-site write refused: origin {text[:100]!r} is neither this server ({own!r}) nor one of "
            "CKPTLAB_CORS_ORIGINS"
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in WRITE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        refusal = self._origin_refusal(headers)
        if refusal is not None:
            await _send_json(send, 403, {"detail": refusal})
            return
        ctype = headers.get(b"content-type")
        has_body = headers.get(b"content-length", b"0") not in (b"0", b"") or b"transfer-encoding" in headers
        media = ctype.split(b";")[0].strip().lower() if ctype is not None else None
        if (media is not None and media != b"application/json") or (media is None and has_body):
            await _send_json(send, 415, {"detail": "writes need 'Content-Type: application/json'"})
            return
        await self.app(scope, receive, send)


def _replay(messages: list[dict], receive: Any) -> Any:
    pending = list(messages)

    async def replayed() -> dict:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def path_pattern(template: str) -> re.Pattern[str]:
    """The request paths of an OpenAPI path template (``/api/experiments/{experiment_id}``:
    a parameter is one path segment)."""
    return re.compile("^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)) + "$")


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
        self._paths: list[tuple[re.Pattern[str], set[str], bool]] | None = None

    def _allowed(self, path: str) -> set[str]:
        """The methods the API serves at ``path``; a literal route (``/api/predictions/batch``)
        wins over a template that also matches it (``/api/predictions/{prediction_id}``)."""
        if self._paths is None:
            self._paths = [
                (path_pattern(template), set(ops), "{" not in template)
                for template, ops in self.openapi().get("paths", {}).items()
            ]
        matches = [(ops, literal) for pattern, ops, literal in self._paths if pattern.match(path)]
        chosen = [ops for ops, literal in matches if literal] or [ops for ops, _ in matches]
        return {m.upper() for ops in chosen for m in ops if m.lower() in _HTTP_METHODS}

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


class CatchErrors:
    """Answer an exception no handler took with a 500 of its own and end the request there,
    so the connection stays usable.

    Starlette's outermost error middleware sends its 500 and then re-raises, for the server
    to log; uvicorn, seeing an exception after a response started, closes the connection,
    and a client's next request on the same keep-alive connection (``/api/health``
    included) was reset. Here the exception is logged (logger ``ckptlab.backend.middleware``,
    with its traceback) and answered with ``{"detail": INTERNAL_ERROR}``, and nothing is
    re-raised. An exception after the response started (a CSV stream cut short) is
    re-raised: the only honest end of a truncated body is a closed connection.

    Args:
        app: the ASGI app to wrap.
    """

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            await _send_json(send, 500, {"detail": INTERNAL_ERROR})


class StreamSlots:
    """A server's cap on concurrent live streams (``max_streams``): each open stream holds a
    slot, no database connection (it polls with a short session each time)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open = 0
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        """Take a slot; False when all ``limit`` are taken."""
        with self._lock:
            if self.open >= self.limit:
                return False
            self.open += 1
            return True

    def release(self) -> None:
        """Give a slot back (a stream ended or its client left)."""
        with self._lock:
            self.open = max(0, self.open - 1)


class StreamCap:
    """The cap on live streams, checked before anything is done for a stream: a request for
    a stream (a ``GET`` whose 200 the OpenAPI document gives as ``media_type``) holds a slot
    of ``slots`` for as long as its response lasts (until the stream ends or its client
    leaves, or the route answered an error), or, every slot taken, is answered here with
    503 and ``Retry-After``, before routing: no dependency, no worker thread, no database
    read, no event generator. A burst of streams over the cap is refused as fast as its
    requests arrive (``bench/bench_stream_burst.py``).

    Args:
        app: the ASGI app to wrap.
        slots: the server's stream slots.
        openapi: returns the app's OpenAPI document (``FastAPI.openapi``), read once.
        media_type: a stream's media type (``text/event-stream``).
    """

    #: Seconds a client refused for the stream cap is told to wait (``Retry-After``).
    RETRY_AFTER_S = 5

    def __init__(self, app: Any, *, slots: StreamSlots, openapi: Callable[[], dict], media_type: str):
        self.app = app
        self.slots = slots
        self.openapi = openapi
        self.media_type = media_type
        self._streams: list[re.Pattern[str]] | None = None

    def _is_stream(self, scope: dict) -> bool:
        """Whether a request asks for a stream route."""
        if self._streams is None:
            self._streams = [
                path_pattern(template)
                for template, ops in self.openapi().get("paths", {}).items()
                if self.media_type in ops.get("get", {}).get("responses", {}).get("200", {}).get("content", {})
            ]
        return scope["method"] == "GET" and any(p.match(scope["path"]) for p in self._streams)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self._is_stream(scope):
            await self.app(scope, receive, send)
        elif not self.slots.acquire():
            detail = f"this server already serves {self.slots.limit} live streams (max_streams); retry later"
            await _send_json(send, 503, {"detail": detail}, [(b"retry-after", str(self.RETRY_AFTER_S).encode())])
        else:
            try:
                await self.app(scope, receive, send)
            finally:
                self.slots.release()
