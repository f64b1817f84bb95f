"""Request-latency histogram as a plain ASGI middleware (cheaper than BaseHTTPMiddleware)."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.server_metrics import ServerMetrics


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route: Any = scope.get("route")
            # The route template, never the raw path: raw paths would be unbounded labels.
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.http_request_seconds.labels(
                method=scope["method"], route=template, status=str(status[0])
            ).observe(time.perf_counter() - started)
