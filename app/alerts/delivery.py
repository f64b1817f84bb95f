"""Posting rendered messages to their channel, with bounded, recorded retries.

Every send returns a `DeliveryRecord` (status, attempts, last error, response code, and one
`AttemptRecord` per try) that the persistence layer stores; nothing here raises for a failed
delivery, so an unreachable Slack can never block the policy engine that asked for it.

Retry rules:
- connection errors, timeouts, HTTP 408/5xx, WeCom errcode -1 (busy): exponential backoff
  `base * 2^(n-1)` capped at `max_delay_s`, with jitter (half fixed, half random);
- HTTP 429: wait what `Retry-After` says (seconds or an HTTP date) instead of the backoff;
- WeCom errcode 45009 (robot over its rate limit): wait at least the channel's
  `rate_limit_pause_s`;
- anything else (a 4xx, another WeCom errcode, a redirect): rejected at once, no retry;
- a wait longer than `max_retry_after_s`, or past the send's deadline, ends the send as failed
  (the caller may schedule a later try) rather than holding a worker.
"""

from __future__ import annotations

import email.utils
import enum
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from app.alerts.config import AlertsConfig, ChannelConfig, WebhookChannel, WeComChannel
from app.alerts.errors import AlertConfigError, HostNotAllowedError
from app.alerts.message import RenderedMessage, encode_body
from app.alerts.ratelimit import RateLimiter, RateLimitRefused, SlidingWindowRateLimiter
from app.alerts.redaction import install_log_filter, redact, register_secret, register_url
from app.alerts.webhook import signature_headers

log = logging.getLogger("rlguard.alerts.delivery")

WECOM_RATE_LIMITED = frozenset({45009})
WECOM_TRANSIENT = frozenset({-1})
MAX_ERROR_CHARS = 300


class DeliveryStatus(enum.StrEnum):
    SENT = "sent"
    FAILED = "failed"  # transient errors until the retry budget ran out
    REJECTED = "rejected"  # a permanent refusal: retrying would not help


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 5
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0
    max_retry_after_s: float = 120.0
    deadline_s: float = 300.0
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise AlertConfigError(f"max_attempts={self.max_attempts} must be at least 1")
        for name in ("base_delay_s", "max_delay_s", "max_retry_after_s", "deadline_s"):
            if getattr(self, name) < 0:
                raise AlertConfigError(f"{name}={getattr(self, name)} must not be negative")
        for name in ("connect_timeout_s", "read_timeout_s"):
            if getattr(self, name) <= 0:
                raise AlertConfigError(f"{name}={getattr(self, name)} must be positive")

    def backoff(self, attempt: int, rng: Callable[[], float]) -> float:
        """Delay after failed attempt `attempt` (1-based): exponential, capped, half jittered."""
        delay = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        return float(delay / 2 + rng() * delay / 2)

    @property
    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(
            connect=self.connect_timeout_s,
            read=self.read_timeout_s,
            write=self.read_timeout_s,
            pool=self.connect_timeout_s,
        )


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    number: int
    part: int
    at: datetime
    response_code: int | None
    error: str | None
    wait_before_s: float


@dataclass
class DeliveryRecord:
    channel: str
    channel_type: str
    status: DeliveryStatus = DeliveryStatus.FAILED
    attempts: int = 0
    parts_total: int = 0
    parts_sent: int = 0
    response_code: int | None = None
    last_error: str | None = None
    attempt_log: list[AttemptRecord] = field(default_factory=list)
    # The last wait the channel asked for (Retry-After, WeCom's rate limit): a later retry
    # must not come sooner.
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class _Outcome:
    ok: bool
    retryable: bool
    response_code: int | None
    error: str | None
    retry_after_s: float | None = None
    rate_limit_wait_s: float = 0.0


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def _short(text: str) -> str:
    text = redact(text.strip().replace("\n", " "))
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _classify_wecom(response: httpx.Response, pause_s: float) -> _Outcome:
    code = response.status_code
    try:
        answer = response.json()
        errcode = int(answer["errcode"])
        errmsg = str(answer.get("errmsg", ""))
    except (ValueError, KeyError, TypeError):
        return _Outcome(
            False, True, code, f"HTTP {code}: answer is not WeCom JSON: {_short(response.text)}"
        )
    if errcode == 0:
        return _Outcome(True, False, code, None)
    error = f"WeCom errcode {errcode}: {_short(errmsg)}"
    if errcode in WECOM_RATE_LIMITED:
        return _Outcome(False, True, code, error, retry_after_s=pause_s)
    return _Outcome(False, errcode in WECOM_TRANSIENT, code, error)


def _classify(response: httpx.Response, channel: ChannelConfig, now: float) -> _Outcome:
    code = response.status_code
    if code == 429:
        retry_after = parse_retry_after(response.headers.get("Retry-After"), now=now)
        return _Outcome(
            False, True, code, f"HTTP 429: {_short(response.text)}", retry_after_s=retry_after
        )
    if code == 408 or code >= 500:
        return _Outcome(False, True, code, f"HTTP {code}: {_short(response.text)}")
    if 300 <= code < 400:
        # Redirects are not followed: the target could be any host.
        return _Outcome(False, False, code, f"HTTP {code}: redirect refused")
    if code >= 400:
        return _Outcome(False, False, code, f"HTTP {code}: {_short(response.text)}")
    if isinstance(channel, WeComChannel):
        return _classify_wecom(response, channel.rate_limit_pause_s)
    return _Outcome(True, False, code, None)


class AlertDeliveryClient:
    """Sends rendered messages to the channels of one `AlertsConfig`, and to nothing else."""

    def __init__(
        self,
        config: AlertsConfig,
        *,
        policy: RetryPolicy | None = None,
        limiter: RateLimiter | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        transport: httpx.BaseTransport | None = None,
        allowed_hosts: frozenset[str] | None = None,
    ) -> None:
        self._config = config
        self._policy = policy or RetryPolicy()
        self._limiter = limiter or SlidingWindowRateLimiter()
        self._sleep = sleep
        self._clock = clock
        self._rng = rng
        # An explicit set can only narrow what the configuration allows, never widen it.
        self._allowed_hosts = config.allowed_hosts()
        if allowed_hosts is not None:
            self._allowed_hosts &= frozenset(h.lower() for h in allowed_hosts)
        for channel in config.channels:
            register_url(channel.url.get_secret_value())
            if isinstance(channel, WebhookChannel):
                register_secret(channel.signing_secret.get_secret_value())
        install_log_filter()
        self._http = httpx.Client(
            timeout=self._policy.timeout,
            follow_redirects=False,
            transport=transport,
            headers={"User-Agent": "rlguard-alerts/1"},
            trust_env=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AlertDeliveryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(
        self, channel_name: str, message: RenderedMessage, *, start_part: int = 0
    ) -> DeliveryRecord:
        """Post `message` to the named channel, parts in order, from `start_part` (a resumed send
        skips the parts an earlier try already delivered). Never raises for delivery errors."""
        channel = self._config.channel(channel_name)
        if message.channel_type != channel.type:
            raise AlertConfigError(
                f"message rendered for {message.channel_type!r} cannot go to {channel.type!r} channel {channel.name!r}"
            )
        if not 0 <= start_part <= len(message.parts):
            raise AlertConfigError(f"start_part={start_part} is outside 0..{len(message.parts)}")
        url = channel.url.get_secret_value()
        host = (urlsplit(url).hostname or "").lower()
        if host not in self._allowed_hosts:
            raise HostNotAllowedError(f"host {host!r} is not a configured alert host")
        record = DeliveryRecord(
            channel=channel.name,
            channel_type=channel.type,
            parts_total=len(message.parts),
            parts_sent=start_part,
        )
        deadline = self._clock() + self._policy.deadline_s
        for index in range(start_part, len(message.parts)):
            if not self._send_part(channel, url, index, message.parts[index], record, deadline):
                return record
            record.parts_sent = index + 1
        record.status = DeliveryStatus.SENT
        record.last_error = None
        log.info(
            "alert delivered",
            extra={"channel": channel.name, "url": channel.masked_url, "attempts": record.attempts},
        )
        return record

    def _send_part(
        self,
        channel: ChannelConfig,
        url: str,
        index: int,
        part: dict[str, Any],
        record: DeliveryRecord,
        deadline: float,
    ) -> bool:
        body = encode_body(part)
        waited = 0.0
        for attempt in range(1, self._policy.max_attempts + 1):
            outcome = self._limited_attempt(channel, url, body)
            waited += outcome.rate_limit_wait_s
            record.attempts += 1
            record.response_code = outcome.response_code
            record.attempt_log.append(
                AttemptRecord(
                    number=record.attempts,
                    part=index,
                    at=datetime.now(UTC),
                    response_code=outcome.response_code,
                    error=outcome.error,
                    wait_before_s=round(waited, 3),
                )
            )
            if outcome.ok:
                return True
            record.last_error = outcome.error
            log.warning(
                "alert attempt failed: channel=%s url=%s attempt=%d error=%s",
                channel.name,
                channel.masked_url,
                attempt,
                outcome.error,
            )
            if not outcome.retryable:
                record.status = DeliveryStatus.REJECTED
                return False
            record.retry_after_s = outcome.retry_after_s
            if attempt == self._policy.max_attempts:
                break
            if outcome.retry_after_s is not None:
                # The server's own figure wins over our backoff.
                delay = max(outcome.retry_after_s, 0.0)
            else:
                delay = self._policy.backoff(attempt, self._rng)
            if delay > self._policy.max_retry_after_s:
                record.last_error = f"{outcome.error} (asked to wait {delay:.0f} s, more than the {self._policy.max_retry_after_s:.0f} s allowed)"
                break
            if self._clock() + delay > deadline:
                record.last_error = (
                    f"{outcome.error} (deadline of {self._policy.deadline_s:.0f} s reached)"
                )
                break
            self._sleep(delay)
            waited = delay
        record.status = DeliveryStatus.FAILED
        return False

    def _limited_attempt(self, channel: ChannelConfig, url: str, body: bytes) -> _Outcome:
        """One attempt, after the channel's rate limiter let it through."""
        if not isinstance(channel, WeComChannel):
            return self._attempt(channel, url, body)
        try:
            waited = self._limiter.acquire(
                channel.name,
                limit=channel.max_per_minute,
                window_s=60.0,
                max_wait_s=self._policy.max_retry_after_s,
            )
        except RateLimitRefused as exc:
            # Not even tried: the robot would refuse it anyway. The next try waits as usual.
            return _Outcome(False, True, None, f"local rate limit: {exc}")
        outcome = self._attempt(channel, url, body)
        return replace(outcome, rate_limit_wait_s=waited)

    def _attempt(self, channel: ChannelConfig, url: str, body: bytes) -> _Outcome:
        headers = {"Content-Type": "application/json; charset=utf-8"}
        if isinstance(channel, WebhookChannel):
            headers.update(
                signature_headers(
                    channel.signing_secret.get_secret_value(), body=body, now=self._clock()
                )
            )
        try:
            response = self._http.post(url, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            return _Outcome(False, True, None, f"timeout: {type(exc).__name__}")
        except httpx.TransportError as exc:
            return _Outcome(
                False, True, None, f"transport error: {type(exc).__name__}: {_short(str(exc))}"
            )
        return _classify(response, channel, self._clock())
