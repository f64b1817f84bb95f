"""The ledger's window as people write it: ``7d``, ``24h``, ``90m`` before now, or an ISO 8601
instant with a time zone. One parser for the REST query and the CLI, with errors that name the
bad value."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from app.core.errors import InvalidInput

_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DEFAULT_SINCE = timedelta(days=1)


def parse_instant(name: str, text: str, *, now: datetime) -> datetime:
    """``text`` as an aware instant: a duration before ``now`` (``7d``) or ISO 8601."""
    value = text.strip()
    m = _RELATIVE.fullmatch(value)
    if m is not None:
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
        if seconds <= 0:
            raise InvalidInput(f"{name} {text!r} is not a positive duration")
        try:
            return now - timedelta(seconds=seconds)
        except OverflowError:
            raise InvalidInput(f"{name} {text!r} reaches before the year 1") from None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"{name} {text!r} is neither a duration before now (e.g. 7d, 24h, 30m) nor an ISO "
            "8601 instant with a time zone (e.g. 2026-12-01T08:00:00Z)"
        ) from None
    if parsed.tzinfo is None:
        raise InvalidInput(f"{name} {text!r} must carry a time zone (e.g. ...Z or +08:00)")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(f"{name} {text!r} is outside the years 1..9999 in UTC") from None


def parse_window(
    since: str | None, until: str | None, *, now: datetime
) -> tuple[datetime, datetime]:
    """(since, until); defaults: the last 24 hours up to now."""
    end = parse_instant("until", until, now=now) if until is not None else now
    start = parse_instant("since", since, now=now) if since is not None else end - DEFAULT_SINCE
    return start, end
