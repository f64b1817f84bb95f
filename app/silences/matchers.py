"""Label matchers (Alertmanager's model) and the labels an incident carries.

A matcher is ``label op value`` with ``op`` one of ``=``, ``!=``, ``=~``, ``!~``. Regexes are
RE2 (``recovery.user_regex``: linear time, Alertmanager's dialect) and anchored at both ends, as
Alertmanager anchors them, so ``node=~gpu-1`` does not also match ``gpu-10``. A label the incident does not have matches as the empty string (again as
Alertmanager): ``rank!=0`` matches a node-level incident that has no rank.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.core.errors import InvalidInput
from app.models.incident import Incident
from recovery.user_regex import UserRegex, UserRegexError, compile_user_regex

# Every alert checks every active silence: keep each one small.
MAX_MATCHERS = 20
MAX_VALUE_CHARS = 300


class Label(StrEnum):
    """The labels a silence may match on; anything else is refused, not silently unmatched."""

    JOB = "job"
    NODE = "node"
    ROLE = "role"
    RANK = "rank"
    KIND = "kind"
    TIER = "tier"


class MatchOp(StrEnum):
    EQUAL = "="
    NOT_EQUAL = "!="
    REGEX = "=~"
    NOT_REGEX = "!~"


@dataclass(frozen=True, slots=True)
class Matcher:
    label: Label
    op: MatchOp
    value: str

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Matcher:
        """From ``{"label", "op", "value"}``; InvalidInput names the bad part."""
        label, op, value = data.get("label"), data.get("op", "="), data.get("value")
        if label not in set(Label):
            allowed = ", ".join(label.value for label in Label)
            raise InvalidInput(f"unknown label {label!r}: a matcher's label is one of {allowed}")
        if op not in set(MatchOp):
            allowed = ", ".join(o.value for o in MatchOp)
            raise InvalidInput(f"unknown operator {op!r} for label {label!r}: one of {allowed}")
        if not isinstance(value, str):
            raise InvalidInput(f"matcher {label}{op}: the value must be a string, got {value!r}")
        if len(value) > MAX_VALUE_CHARS:
            raise InvalidInput(
                f"matcher {label}{op}: the value is over {MAX_VALUE_CHARS} characters"
            )
        matcher = cls(Label(label), MatchOp(op), value)
        if matcher.op in (MatchOp.REGEX, MatchOp.NOT_REGEX):
            matcher.regex(max_chars=MAX_VALUE_CHARS, limit_name="a matcher's value")
        return matcher

    def regex(self, *, max_chars: int, limit_name: str) -> UserRegex:
        """The value compiled for RE2; InvalidInput (422) names the construct or the limit."""
        try:
            return compile_user_regex(self.value, max_chars=max_chars, limit_name=limit_name)
        except UserRegexError as err:
            raise InvalidInput(f"matcher {self.label}{self.op}: bad regex: {err}") from None

    @classmethod
    def parse_text(cls, text: str) -> Matcher:
        """From ``node=n0``, ``node!=n0``, ``job=~grpo-.*``, ``rank!~0|1`` (the CLI's form)."""
        m = re.fullmatch(r"\s*([A-Za-z_]+)\s*(=~|!~|!=|=)(.*)", text)
        if m is None:
            raise InvalidInput(f"matcher {text!r}: expected label=value, !=, =~ or !~")
        return cls.parse({"label": m.group(1), "op": m.group(2), "value": m.group(3).strip()})

    def matches(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.label.value, "")
        if self.op is MatchOp.EQUAL:
            return have == self.value
        if self.op is MatchOp.NOT_EQUAL:
            return have != self.value
        # Stored matchers were checked when they were created, against the hard ceiling.
        hit = self.regex(max_chars=MAX_VALUE_CHARS, limit_name="a matcher's value").fullmatch(have)
        return hit if self.op is MatchOp.REGEX else not hit

    def to_dict(self) -> dict[str, str]:
        return {"label": self.label.value, "op": self.op.value, "value": self.value}

    def __str__(self) -> str:
        return f"{self.label.value}{self.op.value}{self.value}"


def parse_matchers(
    raw: Sequence[Mapping[str, Any]], *, max_regex_chars: int = MAX_VALUE_CHARS
) -> list[Matcher]:
    """A new silence's matchers; ``max_regex_chars`` is ``silences.max_regex_chars``."""
    if len(raw) > MAX_MATCHERS:
        raise InvalidInput(f"{len(raw)} matchers: at most {MAX_MATCHERS}")
    matchers = [Matcher.parse(m) for m in raw]
    for m in matchers:
        if m.op in (MatchOp.REGEX, MatchOp.NOT_REGEX):
            m.regex(
                max_chars=max_regex_chars,
                limit_name="silences.max_regex_chars, RLGUARD_SILENCES__MAX_REGEX_CHARS",
            )
    if not matchers:
        raise InvalidInput("a silence needs at least one matcher (none would silence everything)")
    # Alertmanager's rule: at least one matcher must not match the empty string, otherwise
    # ``job=~.*`` or ``node!=x`` alone would silence (almost) everything, node-level incidents
    # without a job included.
    if all(m.matches({}) for m in matchers):
        raise InvalidInput(
            "the matchers also match an empty label (they would silence almost everything): "
            "at least one must name a value, e.g. node=n0 or job=~grpo-.*"
        )
    return matchers


def all_match(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)


def incident_labels(incident: Incident) -> dict[str, str]:
    """The labels a silence sees on an incident (absent ones are left out)."""
    subject = incident.subject or {}
    labels = {
        Label.JOB.value: incident.job or subject.get("job"),
        Label.NODE.value: incident.node or subject.get("node"),
        Label.ROLE.value: subject.get("role"),
        Label.RANK.value: subject.get("rank"),
        Label.KIND.value: incident.kind,
        Label.TIER.value: incident.tier,
    }
    return {k: str(v) for k, v in labels.items() if v is not None}
