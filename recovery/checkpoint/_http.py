"""Small JSON-over-HTTP plumbing for the coordinator protocol (stdlib only).

Every call has a timeout; a timeout raises :class:`RecoveryTimeout`, anything else that keeps an
answer from arriving (refused connection, reset, non-2xx status, bad JSON) raises
:class:`CoordinatorError` with the peer and the reason. Handlers get the parsed body and return
``(status, body)``; a handler raising :class:`ProtocolInputError` becomes a 400 naming the problem.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from recovery.checkpoint.errors import CheckpointInputError, CoordinatorError
from recovery.errors import RecoveryTimeout

log = logging.getLogger("rlguard.recovery.coordinator.http")

MAX_BODY = 1 << 20
Route = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


class ProtocolInputError(CheckpointInputError):
    """A request body is malformed; answered with HTTP 400 and this message."""


def field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """``body[name]`` checked against ``kind`` (bool is never accepted as an int)."""
    if name not in body:
        raise ProtocolInputError(f"missing field {name!r}")
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise ProtocolInputError(f"field {name!r} must be {kind}, got {value!r}")
    if not isinstance(value, kinds):
        raise ProtocolInputError(f"field {name!r} must be {kind}, got {value!r:.80}")
    return value


class JsonServer:
    """A threaded HTTP server dispatching ``POST``/``GET`` paths to handlers."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Route], *, name: str) -> None:
        routes = dict(routes)

        class Handler(BaseHTTPRequestHandler):
            def _dispatch(self) -> None:
                route = routes.get(f"{self.command} {self.path.split('?')[0]}")
                if route is None:
                    self._reply(404, {"error": f"no route {self.command} {self.path}"})
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length > MAX_BODY:
                        raise ProtocolInputError(f"body of {length} bytes exceeds {MAX_BODY}")
                    raw = self.rfile.read(length) if length else b"{}"
                    try:
                        body = json.loads(raw)
                    except ValueError as exc:
                        raise ProtocolInputError(f"body is not JSON: {exc}") from None
                    if not isinstance(body, dict):
                        raise ProtocolInputError("body must be a JSON object")
                    status, answer = route(body)
                except ProtocolInputError as exc:
                    status, answer = 400, {"error": str(exc)}
                except CheckpointInputError as exc:
                    status, answer = 400, {"error": str(exc)}
                except Exception as exc:  # a bug in a handler: answer 500, log with traceback
                    log.exception("%s: %s %s failed", name, self.command, self.path)
                    status, answer = 500, {"error": f"internal error: {exc!r}"}
                self._reply(status, answer)

            do_GET = _dispatch
            do_POST = _dispatch

            def _reply(self, status: int, body: Mapping[str, Any]) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError as exc:  # the caller gave up (timed out); nothing left to tell it
                    log.debug("%s: reply to %s lost: %r", name, self.path, exc)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("%s: " + format, name, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name=name, daemon=True
        )

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def call(url: str, path: str, body: Mapping[str, Any] | None, *, timeout: float) -> dict[str, Any]:
    """``POST`` (or ``GET`` when ``body`` is None) and return the JSON answer of a 2xx."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise CheckpointInputError(f"peer URL must look like http://host:port, got {url!r}")
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        if body is None:
            conn.request("GET", path)
        else:
            data = json.dumps(body).encode()
            conn.request("POST", path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
    except TimeoutError:
        raise RecoveryTimeout(f"{url}{path} did not answer within {timeout} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise CoordinatorError(f"{url}{path} unreachable: {exc!r}") from exc
    finally:
        conn.close()
    try:
        answer = json.loads(raw) if raw else {}
    except ValueError:
        raise CoordinatorError(f"{url}{path} answered non-JSON ({resp.status})") from None
    if not 200 <= resp.status < 300:
        reason = answer.get("error") if isinstance(answer, dict) else answer
        raise CoordinatorError(f"{url}{path} answered {resp.status}: {reason}")
    if not isinstance(answer, dict):
        raise CoordinatorError(f"{url}{path} answered a non-object")
    return answer
