"""Alertmanager's API v2 shapes for RLGuard's silences and open incidents.

``amtool`` and Grafana's Alertmanager data source speak Alertmanager's API v2. This module
translates between those shapes and the one silence store (``app.silences.store``): a silence
made with ``amtool silence add`` is the same row the Silences page and ``/api/v1/silences``
make, validated, audited and muting by the same code. Nothing here stores anything of its own.

- A matcher ``{name, value, isRegex, isEqual}`` is RLGuard's ``label op value`` (``=``, ``!=``,
  ``=~``, ``!~``); ``alertname`` is another name of ``kind``, stored as ``kind``.
- Silence ids are RLGuard's integer ids written as UUIDs (``00000000-0000-4000-8000-<id in
  hex>``), as the API declares them; the plain integer is accepted too.
- Open incidents are alerts: labels ``alertname`` (its kind), ``job``, ``node``, ``role``,
  ``rank``, ``kind``, ``tier`` (those it has), ``status.silencedBy`` the silences that match it
  now and ``status.inhibitedBy`` the fingerprint of the node-level incident that inhibits it.

Errors are ``InvalidInput`` / ``NotFound`` / ``Conflict`` with Alertmanager-like text (``silence
invalid: ...``); the route sends them as the JSON string Alertmanager sends.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from sqlmodel import Session, col, select

from app.core.errors import InvalidInput, NotFound
from app.models.incident import Incident, IncidentStatus
from app.models.silence import Silence
from app.silences import store
from app.silences.matchers import Label, Matcher, MatchOp, all_match, incident_labels
from app.silences.muting import matching_silences, node_incident_for
from app.silences.public import MatcherIn, SilenceCreate

# Alertmanager's own label for "which alert": RLGuard calls it the incident's kind.
ALERTNAME = "alertname"
RECEIVER = "rlguard"
_UUID_PREFIX = "00000000-0000-4000-8000-"


class AmMatcher(BaseModel):
    name: str
    value: str
    isRegex: bool  # noqa: N815 - Alertmanager's field names
    isEqual: bool = True  # noqa: N815


class AmPostableSilence(BaseModel):
    """``postableSilence``: with an ``id``, an update (the old silence expires, a new one
    starts, as Alertmanager does when the matchers or a started silence's start change)."""

    id: str | None = None
    matchers: list[AmMatcher] = Field(min_length=1)
    startsAt: datetime  # noqa: N815
    endsAt: datetime  # noqa: N815
    createdBy: str  # noqa: N815
    comment: str = Field(max_length=500)


def parse_postable(data: object) -> AmPostableSilence:
    """A ``postableSilence`` from the request's JSON; InvalidInput names the bad field (the
    400 text Alertmanager sends, not FastAPI's list of errors)."""
    try:
        return AmPostableSilence.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise InvalidInput(f"silence invalid: {where}: {first['msg']}") from None


# --- ids -----------------------------------------------------------------------------------


def silence_uuid(silence_id: int) -> str:
    """RLGuard's id as a UUID (version 4 layout, so ``format: uuid`` validators take it)."""
    return f"{_UUID_PREFIX}{silence_id:012x}"


def silence_id_from(text: str) -> int:
    """The row id of ``text``: a UUID this module wrote, or the plain integer id."""
    if text.isascii() and text.isdigit() and len(text) <= 18:
        return int(text)
    try:
        parsed = str(uuid.UUID(text))
    except ValueError:
        raise InvalidInput(f"silence id {text!r} is neither a UUID nor an RLGuard id") from None
    if not parsed.startswith(_UUID_PREFIX):
        raise NotFound(f"silence {text} not found")
    return int(parsed[len(_UUID_PREFIX) :], 16)


# --- matchers ------------------------------------------------------------------------------


def _op(is_regex: bool, is_equal: bool) -> MatchOp:
    if is_regex:
        return MatchOp.REGEX if is_equal else MatchOp.NOT_REGEX
    return MatchOp.EQUAL if is_equal else MatchOp.NOT_EQUAL


def _label_name(name: str) -> str:
    return Label.KIND.value if name == ALERTNAME else name


def _check_label(name: str, where: str) -> None:
    known = {label.value for label in Label} | {ALERTNAME}
    if name not in known:
        allowed = ", ".join(sorted(known))
        raise InvalidInput(
            f"{where}: unknown label {name!r}: RLGuard's alerts carry only the labels {allowed}"
        )


def matchers_in(matchers: Sequence[AmMatcher]) -> list[MatcherIn]:
    """Alertmanager's matchers as the store's; an unknown label is refused naming it."""
    out = []
    for i, m in enumerate(matchers):
        _check_label(m.name, f"silence invalid: invalid label matcher {i}")
        op = _op(m.isRegex, m.isEqual)
        out.append(MatcherIn(label=_label_name(m.name), op=op.value, value=m.value))
    return out


def am_matchers(stored: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in stored:
        op = MatchOp(m.get("op", "="))
        out.append(
            {
                "name": m["label"],
                "value": m["value"],
                "isRegex": op in (MatchOp.REGEX, MatchOp.NOT_REGEX),
                "isEqual": op in (MatchOp.EQUAL, MatchOp.REGEX),
            }
        )
    return out


# A filter as amtool sends it: ``node="n1"``, ``kind=~"gpu_.*"``, optionally in braces, the value
# quoted (Go string escapes) or bare.
_FILTER = re.compile(r'\s*\{?\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(".*"|[^"]*?)\s*\}?\s*')


def parse_filter(text: str) -> Matcher:
    """One ``filter`` query parameter as a matcher; InvalidInput names it when it is bad."""
    m = _FILTER.fullmatch(text)
    if m is None:
        raise InvalidInput(f"bad matcher format: {text}")
    name, op, value = m.group(1), m.group(2), m.group(3)
    _check_label(name, f"bad matcher {text}")
    if value.startswith('"'):
        value = re.sub(r"\\(.)", r"\1", value[1:-1])
    return Matcher.parse({"label": _label_name(name), "op": op, "value": value})


def parse_filters(texts: Sequence[str]) -> list[Matcher]:
    return [parse_filter(t) for t in texts]


def _silence_matches_filter(row: Silence, filters: Sequence[Matcher]) -> bool:
    # Alertmanager's rule for filtering silences: the silence's matchers read as a label set
    # (name -> value), and every filter matcher must match it.
    as_labels = {str(m["label"]): str(m["value"]) for m in row.matchers}
    return all_match(filters, as_labels)


# --- silences ------------------------------------------------------------------------------


def gettable_silence(row: Silence, now: datetime) -> dict[str, Any]:
    assert row.id is not None
    return {
        "id": silence_uuid(row.id),
        "status": {"state": store.silence_state(row, now)},
        "updatedAt": _iso(_updated_at(row)),
        "matchers": am_matchers(row.matchers),
        "startsAt": _iso(row.starts_at),
        "endsAt": _iso(row.ends_at),
        "createdBy": row.author,
        "comment": row.comment,
    }


def _updated_at(row: Silence) -> datetime:
    # An expired-by-hand silence was last changed when it was ended; otherwise when made.
    return row.ends_at if row.expired_by else row.created_at


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def list_silences(session: Session, filters: Sequence[str], now: datetime) -> list[dict[str, Any]]:
    matchers = parse_filters(filters)
    rows = store.list_silences(session, now=now)
    return [gettable_silence(r, now) for r in rows if _silence_matches_filter(r, matchers)]


def get_silence(session: Session, silence_id: str, now: datetime) -> dict[str, Any]:
    row = session.get(Silence, silence_id_from(silence_id))
    if row is None:
        raise NotFound(f"silence {silence_id} not found")
    return gettable_silence(row, now)


@dataclass(frozen=True, slots=True)
class SilenceLimits:
    max_hours: float
    max_regex_chars: int


def post_silence(
    session: Session,
    body: AmPostableSilence,
    *,
    author: str,
    limits: SilenceLimits,
    now: datetime,
) -> int:
    """Create (or, with ``id``, replace) a silence through the store; the new row's id."""
    starts: datetime | None = body.startsAt
    # Alertmanager moves a start in the past to now; the store does the same for None. A naive
    # time goes on to the store, which refuses it naming it (it cannot be compared with now).
    if starts is not None and starts.tzinfo is not None and starts <= now:
        starts = None
    create = SilenceCreate(
        matchers=matchers_in(body.matchers),
        starts_at=starts,
        ends_at=body.endsAt,
        comment=body.comment,
    )
    if body.id:
        old = session.get(Silence, silence_id_from(body.id))
        if old is None:
            raise NotFound(f"silence {body.id} not found")
        if store.silence_state(old, now) != "expired":
            store.expire_silence(session, old.id or 0, actor=author, now=now)
    try:
        row = store.create_silence(
            session,
            create,
            author=author,
            max_hours=limits.max_hours,
            now=now,
            max_regex_chars=limits.max_regex_chars,
        )
    except InvalidInput as err:
        text = str(err)
        prefixed = text if text.startswith("silence invalid") else f"silence invalid: {text}"
        raise InvalidInput(prefixed) from None
    assert row.id is not None
    return row.id


def expire_silence(session: Session, silence_id: str, *, actor: str, now: datetime) -> None:
    store.expire_silence(session, silence_id_from(silence_id), actor=actor, now=now)


# --- alerts --------------------------------------------------------------------------------


def incident_fingerprint(incident: Incident) -> str:
    """Stable per incident (Alertmanager's fingerprint is a 16-hex-digit label hash)."""
    return hashlib.sha256(f"rlguard-incident:{incident.id}".encode()).hexdigest()[:16]


def alert_labels(incident: Incident) -> dict[str, str]:
    return {ALERTNAME: incident.kind, **incident_labels(incident)}


@dataclass(frozen=True, slots=True)
class AlertQuery:
    """``GET /api/v2/alerts``'s parameters (each state flag defaults to true, as in the spec)."""

    filters: tuple[str, ...] = ()
    active: bool = True
    silenced: bool = True
    inhibited: bool = True


def list_alerts(
    session: Session,
    query: AlertQuery,
    *,
    now: datetime,
    incident_url: Callable[[int], str],
    runbook_url: Callable[[str], str],
) -> list[dict[str, Any]]:
    """Open incidents as ``gettableAlert``s, oldest first, with links to the incident's page
    (``generatorURL``) and its kind's runbook (the ``runbook_url`` annotation)."""
    matchers = parse_filters(query.filters)
    rows = session.exec(
        select(Incident)
        .where(Incident.status == IncidentStatus.open.value)
        .order_by(col(Incident.id))
    ).all()
    out = []
    for incident in rows:
        labels = alert_labels(incident)
        if not all_match(matchers, labels):
            continue
        silenced_by = [silence_uuid(s.id or 0) for s in matching_silences(session, incident, now)]
        inhibitor = node_incident_for(session, incident)
        inhibited_by = [incident_fingerprint(inhibitor)] if inhibitor is not None else []
        if silenced_by and not query.silenced:
            continue
        if inhibited_by and not query.inhibited:
            continue
        if not silenced_by and not inhibited_by and not query.active:
            continue
        out.append(
            {
                "labels": labels,
                "annotations": {
                    "summary": incident.summary or incident.kind,
                    "runbook_url": runbook_url(incident.kind),
                },
                "receivers": [{"name": RECEIVER}],
                "fingerprint": incident_fingerprint(incident),
                "startsAt": _iso(incident.opened_at),
                "updatedAt": _iso(incident.updated_at),
                # A firing alert's endsAt is in the future in Alertmanager; an open incident
                # has no end, so say "now" plus nothing: its last update is the honest value.
                "endsAt": _iso(max(incident.updated_at, now)),
                "generatorURL": incident_url(incident.id or 0),
                "status": {
                    "state": "suppressed" if silenced_by or inhibited_by else "active",
                    "silencedBy": silenced_by,
                    "inhibitedBy": inhibited_by,
                },
            }
        )
    return out


def alert_groups(alerts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``GET /api/v2/alerts/groups``: the alerts grouped by job (RLGuard's one receiver has no
    routing tree; a job is what an on-call person looks at), node-level ones without a job in a
    group with no labels."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for alert in alerts:
        groups.setdefault(alert["labels"].get(Label.JOB.value, ""), []).append(alert)
    return [
        {
            "labels": {Label.JOB.value: job} if job else {},
            "receiver": {"name": RECEIVER},
            "alerts": members,
        }
        for job, members in sorted(groups.items())
    ]
