"""Security headers on every response, and a size limit on every request body.

Pages rendered by ``app.views`` set their own Content-Security-Policy (``SECURITY_HEADERS`` in
``app.views.rendering``); anything that did not set one (JSON, static files, errors) gets a
strict default. Headers a response already carries are never overwritten.
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_HEADERS: dict[str, str] = {
    "content-security-policy": (
        "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=(), payment=()",
}
HSTS = ("strict-transport-security", "max-age=31536000; includeSubDomains")


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._defaults = [(k.encode(), v.encode()) for k, v in DEFAULT_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Only over TLS (app.core.forwarded sets the scheme from a trusted proxy's
        # X-Forwarded-Proto):
        # HSTS on plain HTTP would be ignored, and on a test host it would pin it to HTTPS.
        extra = [(HSTS[0].encode(), HSTS[1].encode())] if scope.get("scheme") == "https" else []

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                headers.extend((k, v) for k, v in self._defaults + extra if k not in present)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


class RequestSizeLimitMiddleware:
    """Refuses a request body over ``max_bytes`` with 413 before the route sees any of it.

    Paths in ``own_limit_paths`` enforce their own (larger, streaming) bound and pass through:
    ingest reads its body in chunks against ``RLGUARD_INGEST__MAX_BODY_BYTES``, also inflated.
    Every other body is small, so it is read here in full (up to the limit) and replayed.
    """

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, own_limit_paths: frozenset[str] = frozenset()
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes!r}")
        self.app = app
        self.max_bytes = max_bytes
        self.own_limit_paths = own_limit_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.own_limit_paths:
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _refuse(
                        send,
                        400,
                        f"Content-Length {value.decode(errors='replace')!r} is not a number",
                    )
                    return
                if declared > self.max_bytes:
                    await _refuse(
                        send,
                        413,
                        f"body is {declared} bytes, more than the limit of {self.max_bytes}",
                    )
                    return
        messages: list[Message] = []
        total = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await _refuse(send, 413, f"body is more than the limit of {self.max_bytes} bytes")
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = orjson.dumps({"detail": detail})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
