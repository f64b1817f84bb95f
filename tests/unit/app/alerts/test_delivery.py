"""The delivery client against a real HTTP server on 127.0.0.1 (see _recording_server.py)."""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

import pytest

from app.alerts.config import AlertsConfig
from app.alerts.delivery import AlertDeliveryClient, DeliveryStatus, RetryPolicy, parse_retry_after
from app.alerts.errors import AlertConfigError, HostNotAllowedError
from app.alerts.grouping import AlertBatch, AlertGrouper
from app.alerts.ratelimit import RateLimitWaitTooLong, SlidingWindowRateLimiter
from app.alerts.render import render_batch, render_test_message
from app.alerts.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify_signature
from app.policy.signals import Tier
from tests.harness import free_port
from tests.unit.app.alerts._factories import (
    SLACK_SECRET_PATH,
    T0,
    WEBHOOK_SIGNING,
    WECOM_KEY,
    config,
    event,
    tier_scenario,
)
from tests.unit.app.alerts._recording_server import OK, RecordingServer, Reply, wecom

FAST = RetryPolicy(
    max_attempts=3, base_delay_s=0.01, max_delay_s=0.05, connect_timeout_s=1.0, read_timeout_s=0.5
)
SECRETS = ("slacksecrettoken123", "T0SECRET1", "B0SECRET2", WECOM_KEY, WEBHOOK_SIGNING)


class Sleeps:
    """Records each requested pause and really sleeps it (so the server sees real gaps)."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        time.sleep(seconds)


def client_for(cfg: AlertsConfig, policy: RetryPolicy = FAST, **kwargs: Any) -> AlertDeliveryClient:
    return AlertDeliveryClient(cfg, policy=policy, **kwargs)


def heavy() -> AlertBatch:
    return AlertBatch(tuple(tier_scenario(Tier.HEAVY)))


def send(cfg: AlertsConfig, channel: str, batch: AlertBatch | None = None, **kwargs: Any):  # noqa: ANN201
    message = render_batch(batch or heavy(), channel=cfg.channel(channel), config=cfg)
    with client_for(cfg, **kwargs) as client:
        return client.send(channel, message), message


@pytest.mark.timeout(30)
def test_each_channel_receives_its_payload(server: RecordingServer) -> None:
    cfg = config(server.url(""))
    server.reply(OK, wecom(0), wecom(0), OK)
    with client_for(cfg) as client:
        records = {
            name: client.send(name, render_batch(heavy(), channel=cfg.channel(name), config=cfg))
            for name in ("ops-slack", "ops-wecom", "pager")
        }
    assert {n: (r.status, r.attempts, r.parts_sent) for n, r in records.items()} == {
        "ops-slack": (DeliveryStatus.SENT, 1, 1),
        "ops-wecom": (DeliveryStatus.SENT, 2, 2),
        "pager": (DeliveryStatus.SENT, 1, 1),
    }
    slack, wecom_md, wecom_text, hook = server.requests
    assert slack.path == SLACK_SECRET_PATH
    assert [b["type"] for b in json.loads(slack.body)["blocks"]][0] == "header"
    assert wecom_md.path == f"/cgi-bin/webhook/send?key={WECOM_KEY}"
    assert json.loads(wecom_md.body)["msgtype"] == "markdown"
    assert json.loads(wecom_text.body)["text"]["mentioned_mobile_list"] == ["13800138000"]
    assert hook.headers["Content-Type"].startswith("application/json")
    assert verify_signature(
        WEBHOOK_SIGNING,
        body=hook.body,
        timestamp=hook.headers[TIMESTAMP_HEADER],
        signature=hook.headers[SIGNATURE_HEADER],
        now=time.time(),
    )
    assert json.loads(hook.body)["incident_id"] == 42


@pytest.mark.timeout(30)
def test_500_then_success_is_retried_with_backoff(server: RecordingServer) -> None:
    server.reply(Reply(500, b"boom"), Reply(503, b"later"))
    sleeps = Sleeps()
    record, _ = send(config(server.url("")), "ops-slack", sleep=sleeps, rng=lambda: 1.0)
    assert record.status is DeliveryStatus.SENT and record.attempts == 3
    assert [a.response_code for a in record.attempt_log] == [500, 503, 200]
    assert sleeps.calls == [0.01, 0.02]  # base * 2^(n-1), jitter at its top
    assert record.last_error is None


@pytest.mark.timeout(30)
def test_gives_up_after_the_bounded_attempts(server: RecordingServer) -> None:
    server.default = Reply(500, b"still broken")
    record, _ = send(config(server.url("")), "pager")
    assert record.status is DeliveryStatus.FAILED
    assert record.attempts == 3 == len(server.requests)
    assert record.response_code == 500 and record.last_error == "HTTP 500: still broken"


@pytest.mark.timeout(30)
def test_slack_429_waits_for_retry_after(server: RecordingServer) -> None:
    server.reply(Reply(429, b"rate_limited", {"Retry-After": "1"}))
    sleeps = Sleeps()
    record, _ = send(config(server.url("")), "ops-slack", sleep=sleeps)
    assert record.status is DeliveryStatus.SENT and record.attempts == 2
    assert sleeps.calls == [1.0]
    first, second = server.requests
    assert second.at - first.at >= 1.0
    assert record.attempt_log[1].wait_before_s == 1.0


@pytest.mark.timeout(30)
def test_retry_after_beyond_the_cap_gives_up_at_once(server: RecordingServer) -> None:
    server.reply(Reply(429, b"slow down", {"Retry-After": "3600"}))
    record, _ = send(config(server.url("")), "ops-slack")
    assert record.status is DeliveryStatus.FAILED and record.attempts == 1
    assert "asked to wait 3600 s" in (record.last_error or "") and record.retry_after_s == 3600.0


def test_retry_after_parsing() -> None:
    assert parse_retry_after("7", now=0) == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("soon", now=0) is None and parse_retry_after(None, now=0) is None


@pytest.mark.timeout(30)
def test_wecom_rate_limit_errcode_is_retried_after_a_pause(server: RecordingServer) -> None:
    cfg = config(server.url(""))
    cfg = cfg.model_copy(
        update={
            "channels": (
                cfg.channels[0],
                cfg.channels[1].model_copy(update={"rate_limit_pause_s": 0.3}),
                cfg.channels[2],
            )
        }
    )
    server.reply(wecom(45009, "api freq out of limit"), wecom(0), wecom(0))
    record, _ = send(cfg, "ops-wecom")
    assert record.status is DeliveryStatus.SENT and record.attempts == 3
    assert server.requests[1].at - server.requests[0].at >= 0.3


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (wecom(93000, "invalid webhook url"), "WeCom errcode 93000: invalid webhook url"),
        (Reply(400, b"invalid_payload"), "HTTP 400: invalid_payload"),
        (Reply(404, b"no_service"), "HTTP 404: no_service"),
        (Reply(302, b"", {"Location": "https://elsewhere.example/"}), "HTTP 302: redirect refused"),
    ],
)
def test_permanent_errors_are_not_retried(
    server: RecordingServer, reply: Reply, error: str
) -> None:
    server.reply(reply)
    record, _ = send(config(server.url("")), "ops-wecom")
    assert record.status is DeliveryStatus.REJECTED and record.attempts == 1 == len(server.requests)
    assert record.last_error == error and record.parts_sent == 0


@pytest.mark.timeout(30)
def test_wecom_busy_and_non_json_answers_are_retried(server: RecordingServer) -> None:
    server.reply(wecom(-1, "system busy"), Reply(200, b"<html>proxy</html>"), wecom(0))
    record, _ = send(
        config(server.url("")), "ops-wecom", batch=AlertBatch(tuple(tier_scenario(Tier.MEDIUM)))
    )
    assert record.status is DeliveryStatus.SENT and record.attempts == 3
    assert "not WeCom JSON" in (record.attempt_log[1].error or "")


@pytest.mark.timeout(30)
def test_a_hanging_server_times_out_and_is_retried(server: RecordingServer) -> None:
    server.default = Reply(hang=True)
    started = time.monotonic()
    record, _ = send(
        config(server.url("")),
        "ops-slack",
        policy=RetryPolicy(max_attempts=2, base_delay_s=0.01, read_timeout_s=0.4),
    )
    assert record.status is DeliveryStatus.FAILED and record.attempts == 2 == len(server.requests)
    assert record.last_error == "timeout: ReadTimeout" and record.response_code is None
    assert time.monotonic() - started < 5


@pytest.mark.timeout(30)
def test_nothing_listening_is_a_transport_error() -> None:
    cfg = config(f"http://127.0.0.1:{free_port()}")
    record, _ = send(cfg, "pager")
    assert record.status is DeliveryStatus.FAILED and record.attempts == 3
    assert (record.last_error or "").startswith("transport error: ConnectError")


@pytest.mark.timeout(30)
def test_the_deadline_bounds_the_whole_send(server: RecordingServer) -> None:
    server.default = Reply(500, b"x")
    policy = RetryPolicy(max_attempts=10, base_delay_s=1.0, deadline_s=0.5)
    record, _ = send(config(server.url("")), "pager", policy=policy)
    assert record.status is DeliveryStatus.FAILED and record.attempts == 1
    assert "deadline of 0 s reached" in (record.last_error or "") or "deadline" in (
        record.last_error or ""
    )


@pytest.mark.timeout(30)
def test_a_resumed_send_skips_delivered_parts(server: RecordingServer) -> None:
    cfg = config(server.url(""))
    server.default = wecom(0)
    server.reply(wecom(0), wecom(93000, "bad"))
    record, message = send(cfg, "ops-wecom")
    assert record.status is DeliveryStatus.REJECTED and record.parts_sent == 1
    with client_for(cfg) as client:
        again = client.send("ops-wecom", message, start_part=record.parts_sent)
    assert again.status is DeliveryStatus.SENT and again.parts_sent == 2 and again.attempts == 1
    assert [json.loads(r.body)["msgtype"] for r in server.requests] == ["markdown", "text", "text"]


@pytest.mark.timeout(30)
def test_wecom_respects_its_per_minute_limit(server: RecordingServer) -> None:
    now = [1000.0]
    pauses: list[float] = []

    def fake_sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    limiter = SlidingWindowRateLimiter(clock=lambda: now[0], sleep=fake_sleep)
    cfg = config(server.url(""))
    message = render_batch(
        AlertBatch(tuple(tier_scenario(Tier.MEDIUM))), channel=cfg.channel("ops-wecom"), config=cfg
    )
    server.default = wecom(0)
    with client_for(cfg, limiter=limiter) as client:
        records = [client.send("ops-wecom", message) for _ in range(21)]
    assert all(r.status is DeliveryStatus.SENT for r in records)
    assert pauses == [60.0]  # the 21st message waits for the first to leave the minute
    assert records[-1].attempt_log[0].wait_before_s == 60.0
    assert len(server.requests) == 21


def test_rate_limiter_window() -> None:
    now = [0.0]
    limiter = SlidingWindowRateLimiter(
        clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
    )
    assert [limiter.acquire("a", limit=2, window_s=60) for _ in range(2)] == [0.0, 0.0]
    assert limiter.acquire("b", limit=2, window_s=60) == 0.0  # keys are independent
    assert limiter.acquire("a", limit=2, window_s=60) == 60.0
    with pytest.raises(ValueError, match="must be positive"):
        limiter.acquire("a", limit=0, window_s=60)


@pytest.mark.timeout(30)
def test_three_signals_in_five_seconds_buzz_once_per_channel(server: RecordingServer) -> None:
    cfg = config(server.url(""))
    events = [
        event(event_id="a", kind="opened", occurred_at=T0),
        event(event_id="b", kind="escalated", tier="heavy", occurred_at=T0 + timedelta(seconds=2)),
        event(
            event_id="c",
            kind="approval_requested",
            tier="heavy",
            approval_id=7,
            occurred_at=T0 + timedelta(seconds=5),
        ),
    ]
    server.default = wecom(0)  # every channel accepts a 200 with a JSON body
    with client_for(cfg) as client:
        for channel in cfg.channels:
            grouper = AlertGrouper(group_wait=cfg.group_wait)
            for e in events:
                grouper.add(e)
            for second in range(0, 12):
                for batch in grouper.flush(T0 + timedelta(seconds=second)):
                    record = client.send(
                        channel.name, render_batch(batch, channel=channel, config=cfg)
                    )
                    assert record.status is DeliveryStatus.SENT
    paths = [r.path for r in server.requests]
    assert paths.count(SLACK_SECRET_PATH) == 1
    assert paths.count("/rlguard/hook") == 1
    wecom_bodies = [json.loads(r.body) for r in server.requests if "key=" in r.path]
    assert [b["msgtype"] for b in wecom_bodies] == ["markdown", "text"]  # one message + its mention


@pytest.mark.timeout(30)
def test_secrets_stay_out_of_logs_records_and_reprs(
    server: RecordingServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cfg = config(server.url(""))
    # A server that echoes the URL it was called on into its error message.
    server.reply(
        Reply(500, f"bad url {server.url(SLACK_SECRET_PATH)}".encode()),
        OK,
        wecom(93000, f"invalid webhook url key={WECOM_KEY}"),
        Reply(401, f"bad signature, expected secret {WEBHOOK_SIGNING}".encode()),
    )
    with client_for(cfg) as client:
        records = [
            client.send(name, render_batch(heavy(), channel=cfg.channel(name), config=cfg))
            for name in ("ops-slack", "ops-wecom", "pager")
        ]
        shown = repr(client.__dict__)
    assert "HTTP Request: POST" in caplog.text  # httpx did log its requests...
    assert "alert attempt failed" in caplog.text
    texts = [caplog.text, shown, repr(cfg), *(repr(r) for r in records)]
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret} leaked"
    assert f"http://127.0.0.1:{server.port}/***" in caplog.text  # ...with the URL masked


def test_bad_calls_are_refused_before_any_request(server: RecordingServer) -> None:
    cfg = config(server.url(""))
    slack_message = render_batch(heavy(), channel=cfg.channel("ops-slack"), config=cfg)
    with client_for(cfg) as client:
        with pytest.raises(
            AlertConfigError, match="rendered for 'slack' cannot go to 'webhook' channel 'pager'"
        ):
            client.send("pager", slack_message)
        with pytest.raises(AlertConfigError, match="no alert channel named 'nope'"):
            client.send("nope", slack_message)
        with pytest.raises(AlertConfigError, match="start_part=5"):
            client.send("ops-slack", slack_message, start_part=5)
    with client_for(cfg, allowed_hosts=frozenset({"hooks.slack.com"})) as narrowed:
        with pytest.raises(HostNotAllowedError, match="'127.0.0.1' is not a configured alert host"):
            narrowed.send("ops-slack", slack_message)
    assert server.requests == []
    with pytest.raises(AlertConfigError, match="max_attempts=0"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(AlertConfigError, match="read_timeout_s=0"):
        RetryPolicy(read_timeout_s=0)


def test_host_allowlist_in_configuration(server: RecordingServer) -> None:
    from app.alerts.config import parse_alerts_config

    with pytest.raises(AlertConfigError, match="host '127.0.0.1' is not in host_allowlist"):
        parse_alerts_config(
            {
                "host_allowlist": ["hooks.slack.com"],
                "channels": [{"type": "slack", "name": "a", "url": server.url("/x")}],
            }
        )


@pytest.mark.timeout(30)
def test_test_message_goes_out(server: RecordingServer) -> None:
    cfg = config(server.url(""))
    server.default = wecom(0)
    with client_for(cfg) as client:
        for channel in cfg.channels:
            record = client.send(
                channel.name, render_test_message(channel=channel, config=cfg, now=T0)
            )
            assert record.status is DeliveryStatus.SENT
    assert len(server.requests) == 3


def test_rate_limiter_refuses_to_wait_too_long() -> None:
    now = [0.0]
    limiter = SlidingWindowRateLimiter(
        clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
    )
    limiter.acquire("a", limit=1, window_s=60)
    with pytest.raises(RateLimitWaitTooLong, match="would wait 60.0 s > 5"):
        limiter.acquire("a", limit=1, window_s=60, max_wait_s=5)


class SaturatedLimiter:
    def __init__(self) -> None:
        self.calls = 0

    def acquire(self, key: str, *, limit: int, window_s: float, max_wait_s: float = 120.0) -> float:
        self.calls += 1
        raise RateLimitWaitTooLong(f"{key}: would wait 59.0 s > {max_wait_s} s")


@pytest.mark.timeout(30)
def test_a_saturated_limiter_fails_the_send_without_posting(server: RecordingServer) -> None:
    limiter = SaturatedLimiter()
    record, _ = send(
        config(server.url("")),
        "ops-wecom",
        limiter=limiter,
        policy=RetryPolicy(max_attempts=2, base_delay_s=0.01, max_retry_after_s=5),
    )
    assert record.status is DeliveryStatus.FAILED and record.attempts == 2 and limiter.calls == 2
    assert record.last_error == "local rate limit: ops-wecom: would wait 59.0 s > 5 s"
    assert server.requests == []
