"""A real HTTP server on 127.0.0.1 that records requests and answers from a script."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False  # keep the connection open without answering (until the server stops)


OK = Reply()


def wecom(errcode: int, errmsg: str = "ok") -> Reply:
    body = json.dumps({"errcode": errcode, "errmsg": errmsg}).encode()
    return Reply(200, body, {"Content-Type": "application/json"})


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


class RecordingServer:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._script: deque[Reply] = deque()
        self.default = OK
        self._stop = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                reply = server._record_and_pick(self.path, dict(self.headers.items()), body)
                if reply.hang:
                    server._stop.wait(30)
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _record_and_pick(self, path: str, headers: dict[str, str], body: bytes) -> Reply:
        with self._lock:
            self.requests.append(Recorded(path, headers, body, time.monotonic()))
            return self._script.popleft() if self._script else self.default

    def reply(self, *replies: Reply) -> None:
        """Answer the next requests with `replies`, in order, then with `default`."""
        with self._lock:
            self._script.extend(replies)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
