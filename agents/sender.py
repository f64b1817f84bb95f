"""Delivers the spool's batches to ``POST /api/v1/ingest``, oldest first, one at a time.

Outcomes of one delivery (the ingest contract of the foundation issue):

- 2xx: acknowledged (``{"accepted": N, "duplicate": bool}``; a duplicate is a batch the server
  applied before, e.g. when an earlier answer was lost); the batch leaves the spool.
- unreachable, timeout, 429 or 5xx: the batch stays; retried after an exponential backoff with
  jitter (``backoff_base`` doubling up to ``backoff_max``); order is kept because nothing newer
  is sent before it.
- any other 4xx: the batch can never succeed; the server's reason is logged, the batch is dropped
  and its samples counted as ``rejected``.

Bodies larger than ``gzip_min_bytes`` are sent gzip-compressed; if the server refuses a compressed
body (400 or 415), the same batch is resent uncompressed and compression stays off.
"""

from __future__ import annotations

import gzip
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import httpx
import orjson

from agents.spool import Spool

log = logging.getLogger("rlguard.agent.sender")


class Outcome(Enum):
    """What became of one delivery attempt."""

    ACKED = "acked"
    RETRY = "retry"
    REJECTED = "rejected"


@dataclass
class SenderStats:
    """Counters of this agent process (the spool keeps the persistent ones)."""

    batches_sent: int = 0
    duplicates: int = 0
    send_failures: int = 0
    rejected_batches: int = 0
    last_send_ok: float | None = None
    last_error: str | None = None


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Delay before retry number ``attempt`` (1, 2, ...): half fixed, half random ("equal jitter")."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return float(ceiling / 2 + rng.uniform(0, ceiling / 2))


class Sender:
    """Owns the HTTP client and the delivery thread; :meth:`start` / :meth:`stop` it."""

    def __init__(
        self,
        spool: Spool,
        *,
        url: str,
        token: str,
        connect_timeout: float = 3.0,
        request_timeout: float = 15.0,
        backoff_base: float = 0.5,
        backoff_max: float = 15.0,
        gzip_min_bytes: int = 64 * 1024,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._spool = spool
        self._endpoint = url.rstrip("/") + "/api/v1/ingest"
        self._client = httpx.Client(
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=httpx.Timeout(request_timeout, connect=connect_timeout),
            transport=transport,
        )
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._gzip_min_bytes = gzip_min_bytes
        self._gzip_ok = gzip_min_bytes > 0
        self._clock = clock
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures_in_row = 0
        self._lock = threading.Lock()
        self.stats = SenderStats()

    def start(self) -> None:
        """Start the delivery thread."""
        self._thread = threading.Thread(target=self._run, name="rlguard-agent-sender", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Ask the thread to stop and wait up to ``timeout`` s; True if it stopped."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            stopped = not self._thread.is_alive()
        else:
            stopped = True
        if stopped:
            self._client.close()
        return stopped

    @property
    def healthy(self) -> bool:
        """True while the delivery thread runs and its last attempt did not fail."""
        thread = self._thread
        return thread is not None and thread.is_alive() and self._failures_in_row == 0

    def _run(self) -> None:
        while not self._stop.is_set():
            outcome = self.deliver_one(wait=0.5)
            if outcome is Outcome.RETRY:
                delay = backoff_delay(
                    self._failures_in_row, self._backoff_base, self._backoff_max, self._rng
                )
                self._stop.wait(delay)

    def deliver_one(self, *, wait: float) -> Outcome | None:
        """Deliver the oldest batch once; None when the spool stayed empty for ``wait`` s."""
        with self._lock:  # drain() at shutdown and the thread must not send the same batch
            item = self._spool.wait_oldest(wait)
            if item is None:
                return None
            seq, body = item
            try:
                outcome, detail = self._post(body)
            except BaseException:
                self._spool.unpin()
                raise
            if outcome is Outcome.ACKED:
                self._spool.acknowledge(seq)
                self._failures_in_row = 0
                self.stats.batches_sent += 1
                self.stats.last_send_ok = self._clock()
                if detail == "duplicate":
                    self.stats.duplicates += 1
            elif outcome is Outcome.REJECTED:
                dropped = self._spool.acknowledge(seq, rejected=True)
                self.stats.rejected_batches += 1
                self.stats.last_error = detail
                log.error(
                    "server refused batch seq=%d (%d samples dropped): %s", seq, dropped, detail
                )
            else:
                self._spool.unpin()
                self._failures_in_row += 1
                self.stats.send_failures += 1
                if self.stats.last_error != detail or self._failures_in_row == 1:
                    log.warning("delivery of seq=%d failed, will retry: %s", seq, detail)
                self.stats.last_error = detail
            return outcome

    def _post(self, stored: bytes) -> tuple[Outcome, str]:
        # The spool keeps the body without sent_at; stamp it now (splice before the final brace).
        body = stored[:-1] + b',"sent_at":' + orjson.dumps(self._clock()) + b"}"
        compressed = self._gzip_ok and len(body) >= self._gzip_min_bytes
        outcome, detail, status = self._attempt(body, compressed)
        if compressed and status in (400, 415):
            log.warning("server refused a gzip body (%s); sending uncompressed from now on", detail)
            self._gzip_ok = False
            outcome, detail, status = self._attempt(body, False)
        return outcome, detail

    def _attempt(self, body: bytes, compressed: bool) -> tuple[Outcome, str, int | None]:
        headers = {"Content-Encoding": "gzip"} if compressed else {}
        payload = gzip.compress(body, compresslevel=5) if compressed else body
        try:
            response = self._client.post(self._endpoint, content=payload, headers=headers)
        except httpx.TimeoutException as exc:
            return Outcome.RETRY, f"timeout: {type(exc).__name__}", None
        except httpx.TransportError as exc:
            return Outcome.RETRY, f"unreachable: {type(exc).__name__}: {exc}", None
        status = response.status_code
        if 200 <= status < 300:
            try:
                ack = response.json()
                duplicate = bool(ack.get("duplicate"))
            except (ValueError, AttributeError):
                return Outcome.RETRY, f"HTTP {status} with an unreadable answer", status
            return Outcome.ACKED, "duplicate" if duplicate else "ok", status
        reason = _reason(response)
        if status == 429 or status >= 500:
            return Outcome.RETRY, f"HTTP {status}: {reason}", status
        return Outcome.REJECTED, f"HTTP {status}: {reason}", status


def _reason(response: httpx.Response) -> str:
    try:
        doc = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(doc, dict) and "detail" in doc:
        return str(doc["detail"])[:300]
    return str(doc)[:300]
