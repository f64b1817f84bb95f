from __future__ import annotations

import asyncio

import pytest

from app.core.security_headers import RequestSizeLimitMiddleware, SecurityHeadersMiddleware


def _run(app, scope, chunks):  # type: ignore[no-untyped-def]
    sent: list[dict] = []
    incoming = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive():  # type: ignore[no-untyped-def]
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):  # type: ignore[no-untyped-def]
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def _echo_app():  # type: ignore[no-untyped-def]
    seen: list[bytes] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        seen.append(body)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"x-frame-options", b"SAMEORIGIN")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app, seen


def _scope(path="/x", headers=(), scheme="http"):  # type: ignore[no-untyped-def]
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": list(headers),
        "scheme": scheme,
    }


def test_headers_added_but_never_overwritten() -> None:
    app, _ = _echo_app()
    sent = _run(SecurityHeadersMiddleware(app), _scope(), [b"hi"])
    headers = dict(sent[0]["headers"])
    assert headers[b"x-frame-options"] == b"SAMEORIGIN"  # the app's own value stays
    assert headers[b"x-content-type-options"] == b"nosniff"
    assert b"frame-ancestors 'none'" in headers[b"content-security-policy"]
    assert b"strict-transport-security" not in headers
    sent = _run(SecurityHeadersMiddleware(app), _scope(scheme="https"), [b"hi"])
    assert b"strict-transport-security" in dict(sent[0]["headers"])


def test_chunked_body_over_the_limit_never_reaches_the_app() -> None:
    app, seen = _echo_app()
    mw = RequestSizeLimitMiddleware(app, max_bytes=10)
    sent = _run(mw, _scope(), [b"12345", b"67890", b"x"])
    assert sent[0]["status"] == 413 and seen == []
    assert b"limit of 10 bytes" in sent[1]["body"]


def test_body_within_the_limit_is_replayed_whole() -> None:
    app, seen = _echo_app()
    mw = RequestSizeLimitMiddleware(app, max_bytes=10)
    sent = _run(mw, _scope(), [b"12345", b"67890"])
    assert sent[0]["status"] == 200 and seen == [b"1234567890"]


def test_declared_length_over_the_limit_and_a_bad_length() -> None:
    app, seen = _echo_app()
    mw = RequestSizeLimitMiddleware(app, max_bytes=10)
    sent = _run(mw, _scope(headers=[(b"content-length", b"11")]), [b""])
    assert sent[0]["status"] == 413 and b"11 bytes" in sent[1]["body"]
    sent = _run(mw, _scope(headers=[(b"content-length", b"ten")]), [b""])
    assert sent[0]["status"] == 400 and b"'ten'" in sent[1]["body"]
    assert seen == []


def test_own_limit_paths_pass_through() -> None:
    app, seen = _echo_app()
    mw = RequestSizeLimitMiddleware(app, max_bytes=1, own_limit_paths=frozenset({"/ingest"}))
    sent = _run(mw, _scope(path="/ingest"), [b"a big body"])
    assert sent[0]["status"] == 200 and seen == [b"a big body"]


def test_bad_limit_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        RequestSizeLimitMiddleware(_echo_app()[0], max_bytes=0)
