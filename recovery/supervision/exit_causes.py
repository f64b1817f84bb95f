"""The exit-cause catalogue: known fatal lines of a process's output, and matching them.

The catalogue is a data file (``exit_causes.yaml`` beside this module; its header documents the
fields). :func:`load_catalogue` reads and checks it, refusing a bad file with
:class:`CatalogueError` whose message names the file, the line and the bad value: a launcher
must not start with a catalogue that would silently never match. :meth:`Catalogue.match` finds
the cause of one exit in the tail of the process's own output.

Patterns are compiled with RE2 through ``recovery.user_regex`` (the one compiler of patterns
people write, which names what RE2 refuses): a process's output is arbitrary text, and a
catalogue row must cost time linear in it whatever it holds.

The tier and plan of each row are the server's business (it checks them against its own
vocabulary when it loads the same file, ``app/policy/exit_causes.py``); the launcher checks
what it uses: the structure, the patterns and the kinds.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recovery.errors import RecoveryError
from recovery.user_regex import UserRegex, UserRegexError, compile_user_regex

DEFAULT_CATALOGUE = Path(__file__).with_name("exit_causes.yaml")

# The fault kinds an exit cause may open (the server's FaultKind values; a test holds the two
# together). A kind outside this list would reach the server as something it cannot classify.
EXIT_CAUSE_KINDS = frozenset(
    {
        "cuda_oom",
        "cuda_error",
        "host_oom",
        "collective_timeout",
        "storage_unwritable",
        "rollout_engine_down",
        "heartbeat_lost",
        "train_hang",
    }
)
TIERS = ("light", "medium", "heavy")
_CAUSE_RE = re.compile(r"[a-z][a-z0-9_]{0,47}")
_FIELDS = frozenset({"cause", "pattern", "kind", "tier", "plan", "source", "signals"})
_REQUIRED = ("cause", "pattern", "kind", "tier", "plan", "source")
# What a heartbeat and a sample label carry of the matched line: the match with some context.
EVIDENCE_CHARS = 120
_MAX_PATTERN_CHARS = 2000


class CatalogueError(RecoveryError):
    """The catalogue file cannot be used; the message names the file, line and bad value."""


@dataclass(frozen=True, slots=True)
class CauseRow:
    """One row of the catalogue."""

    cause: str
    pattern: str
    kind: str
    tier: str
    plan: tuple[str, ...]
    source: str
    signals: frozenset[str]  # empty: any failed exit
    line: int  # where the row starts in its file (1-based), for messages
    regex: UserRegex  # RE2, through the one compiler of user patterns


@dataclass(frozen=True, slots=True)
class ExitCause:
    """The cause found for one exit: the row and the line that matched (redacted by the
    caller before it reaches here), clipped to :data:`EVIDENCE_CHARS` around the match."""

    cause: str
    kind: str
    line: str
    source: str

    def to_dict(self) -> dict[str, str]:
        return {"cause": self.cause, "kind": self.kind, "line": self.line, "source": self.source}


@dataclass(frozen=True, slots=True)
class Catalogue:
    """The rows of a catalogue file, in priority order."""

    rows: tuple[CauseRow, ...]
    path: Path

    def match(self, lines: Sequence[str], *, exit_signal: str | None) -> ExitCause | None:
        """The cause of an exit whose output ended with ``lines`` (oldest first), or None.

        The first row (catalogue order is priority) with a matching line wins; the newest
        line it matches is the evidence. ``exit_signal``: the name of the signal that ended
        the process (``SIGKILL``), None for an exit code; rows with ``signals`` need one of
        theirs.
        """
        for row in self.rows:
            if row.signals and exit_signal not in row.signals:
                continue
            for text in reversed(lines):
                found = row.regex.span(text)
                if found is not None:
                    return ExitCause(row.cause, row.kind, clip(text, *found), row.source)
        return None


def clip(text: str, start: int, end: int, width: int = EVIDENCE_CHARS) -> str:
    """At most ``width`` characters of ``text`` around ``text[start:end]`` (the match first,
    then what follows it, which usually says how much memory or which collective)."""
    text = text.strip()
    if len(text) <= width:
        return text
    begin = max(0, min(start - 20, len(text) - width))
    piece = text[begin : begin + width]
    return ("…" if begin > 0 else "") + piece.strip()


def load_catalogue(path: Path | None = None) -> Catalogue:
    """Read and check the catalogue at ``path`` (default: the one shipped with RLGuard)."""
    path = path or DEFAULT_CATALOGUE
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogueError(f"exit-cause catalogue {path}: cannot be read ({exc})") from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise CatalogueError(f"exit-cause catalogue {path}: not valid YAML ({exc})") from exc
    causes = _mapping_value(root, "causes")
    if not isinstance(causes, yaml.SequenceNode) or not causes.value:
        raise CatalogueError(f"exit-cause catalogue {path}: needs a non-empty list 'causes'")
    rows: list[CauseRow] = []
    seen: dict[str, int] = {}
    for node in causes.value:
        row = _row(path, node)
        if row.cause in seen:
            raise CatalogueError(
                f"exit-cause catalogue {path}, line {row.line}: cause {row.cause!r} is listed "
                f"twice (first at line {seen[row.cause]})"
            )
        seen[row.cause] = row.line
        rows.append(row)
    return Catalogue(tuple(rows), path)


def _mapping_value(root: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(root, yaml.MappingNode):
        return None
    for k, v in root.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    return None


def _row(path: Path, node: yaml.Node) -> CauseRow:
    line = node.start_mark.line + 1
    where = f"exit-cause catalogue {path}, line {line}"
    if not isinstance(node, yaml.MappingNode):
        raise CatalogueError(f"{where}: a row must be a mapping of {', '.join(_REQUIRED)}")
    data = yaml.safe_load(yaml.serialize(node))
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise CatalogueError(f"{where}: unknown field {unknown[0]!r} (known: {sorted(_FIELDS)})")
    missing = [f for f in _REQUIRED if data.get(f) is None or data.get(f) == ""]  # plan may be []
    if missing:
        raise CatalogueError(f"{where}: missing {missing[0]!r}")
    cause, kind, tier, source = data["cause"], data["kind"], data["tier"], data["source"]
    if not isinstance(cause, str) or not _CAUSE_RE.fullmatch(cause):
        raise CatalogueError(f"{where}: cause {cause!r} must be snake_case (a-z, 0-9, _)")
    if kind not in EXIT_CAUSE_KINDS:
        raise CatalogueError(
            f"{where}: unknown kind {kind!r} for cause {cause!r} "
            f"(known: {', '.join(sorted(EXIT_CAUSE_KINDS))})"
        )
    if tier not in TIERS:
        raise CatalogueError(f"{where}: tier {tier!r} must be one of {', '.join(TIERS)}")
    plan = data["plan"]
    if not isinstance(plan, list) or not all(isinstance(a, str) and a for a in plan):
        raise CatalogueError(f"{where}: plan {plan!r} must be a list of action names")
    if not isinstance(source, str):
        raise CatalogueError(f"{where}: source must be text naming where the pattern comes from")
    pattern = data["pattern"]
    if not isinstance(pattern, str) or len(pattern) > _MAX_PATTERN_CHARS:
        raise CatalogueError(
            f"{where}: pattern of {cause!r} must be text of at most {_MAX_PATTERN_CHARS} chars"
        )
    try:
        regex = compile_user_regex(
            pattern, max_chars=_MAX_PATTERN_CHARS, limit_name="a catalogue pattern's limit"
        )
    except UserRegexError as exc:
        raise CatalogueError(
            f"{where}: pattern {pattern!r} of {cause!r} is not valid: {exc}"
        ) from None
    return CauseRow(
        cause=cause,
        pattern=pattern,
        kind=kind,
        tier=tier,
        plan=tuple(plan),
        source=" ".join(source.split()),
        signals=_signals(where, data.get("signals")),
        line=line,
        regex=regex,
    )


def _signals(where: str, raw: Any) -> frozenset[str]:
    if raw is None:
        return frozenset()
    names = raw if isinstance(raw, list) else [raw]
    for name in names:
        if not isinstance(name, str) or name not in signal.Signals.__members__:
            raise CatalogueError(f"{where}: signals: {name!r} is not a signal name (SIGKILL ...)")
    return frozenset(names)
