"""Keep webhook secrets out of logs and error texts.

httpx logs every request's full URL at INFO ("HTTP Request: POST https://…?key=…"), and a WeCom
robot's `key` or a Slack webhook path is all an attacker needs to post into the channel. The
delivery client registers each channel's secrets here; a filter on the `httpx` and `httpcore`
loggers rewrites their records, and `redact()` cleans any text we store or log ourselves.
"""

from __future__ import annotations

import logging
import threading
from urllib.parse import parse_qsl, urlsplit

from app.alerts.config import mask_url
from recovery.redaction import replace_secrets

_lock = threading.Lock()
_replacements: dict[str, str] = {}

# Query values and path segments shorter than this are not secrets worth a replacement (and
# replacing "send" or "v1" everywhere would garble the logs).
_MIN_SECRET_LEN = 8


def register_url(raw: str) -> None:
    """Remember `raw` and its secret pieces (query values, long path segments) for redaction."""
    masked = mask_url(raw)
    parts = urlsplit(raw)
    found = {raw: masked, raw.split("://", 1)[-1]: masked}
    for _, value in parse_qsl(parts.query, keep_blank_values=False):
        if len(value) >= _MIN_SECRET_LEN:
            found[value] = "***"
    for segment in parts.path.split("/"):
        if len(segment) >= _MIN_SECRET_LEN:
            found[segment] = "***"
    with _lock:
        _replacements.update(found)


def register_secret(secret: str) -> None:
    if len(secret) >= _MIN_SECRET_LEN:
        with _lock:
            _replacements[secret] = "***"


def redact(value: str) -> str:
    """`value` with every registered secret replaced (longest first, so URLs go whole)."""
    with _lock:
        replacements = dict(_replacements)
    return replace_secrets(value, replacements)


class RedactingFilter(logging.Filter):
    """Rewrites a record's message with `redact()`; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            # A malformed record: keep the template only, its arguments may hold a URL.
            message = str(record.msg)
        cleaned = redact(message)
        if cleaned != message or record.args:
            record.msg = cleaned
            record.args = None
        return True


_FILTER = RedactingFilter()


def install_log_filter() -> None:
    """Attach the filter to the HTTP client's loggers (idempotent)."""
    # Filters do not propagate to child loggers, so each logger that may see a URL is named.
    for name in (
        "httpx",
        "httpcore",
        "httpcore.connection",
        "httpcore.http11",
        "httpcore.http2",
        "httpcore.proxy",
    ):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
