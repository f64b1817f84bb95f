"""Regular expressions that someone typed: compiled for RE2, bounded in length.

Every regex that comes from a person or a file a person edits (silence matchers on the server,
Ray role presets on a node) goes through :func:`compile_user_regex`. RE2 matches in time linear
in the input, so no pattern can stall the process that evaluates it (Python's backtracking
engine takes 2^n steps for ``(a+)+`` against ``a…ab``), and it is the dialect Alertmanager's
matchers use. What RE2 cannot do, lookarounds and backreferences above all, is refused with a
message that names the construct instead of RE2's terse parser error.

This module lives in ``recovery`` because it is the one layer the server, the agent's
integrations and the node-side tools may all import.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import re2

__all__ = ["UserRegex", "UserRegexError", "compile_user_regex"]


class UserRegexError(ValueError):
    """A pattern that is too long or that RE2 cannot compile; the message says why."""


# RE2's "invalid perl operator: X" names the opening of the group it refused.
_PERL_OPERATORS = {
    "(?=": "a lookahead (?=...)",
    "(?!": "a negative lookahead (?!...)",
    "(?<=": "a lookbehind (?<=...)",
    "(?<!": "a negative lookbehind (?<!...)",
    "(?>": "an atomic group (?>...)",
    "(?(": "a conditional group (?(...)...)",
    "(?#": "a comment group (?#...)",
}
# A counted repetition: RE2 refuses counts over 1000, but a count past 2^32 wraps in its parser
# and compiles into a pattern that matches nothing, so the counts are checked here first.
_REPETITION = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")
_MAX_REPEAT = 1000
_NOT_LINEAR = "RE2 runs in linear time and has no lookarounds, backreferences or atomic groups"


@dataclass(frozen=True, slots=True)
class UserRegex:
    """A compiled user pattern. ``fullmatch`` is anchored at both ends (Alertmanager's
    matchers: ``node=~gpu-1`` does not match ``gpu-10``); ``search`` finds it anywhere."""

    pattern: str
    _compiled: object

    def fullmatch(self, text: str) -> bool:
        """Whether the whole of ``text`` matches."""
        return self._compiled.fullmatch(text) is not None  # type: ignore[attr-defined]

    def span(self, text: str) -> tuple[int, int] | None:
        """``(start, end)`` of the first match anywhere in ``text``, or None."""
        found = self._compiled.search(text)  # type: ignore[attr-defined]
        return None if found is None else (int(found.start()), int(found.end()))

    def search(self, text: str) -> dict[str, str | None] | None:
        """The named groups of the first match anywhere in ``text`` (empty when the pattern
        names none), or None when there is no match."""
        found = self._compiled.search(text)  # type: ignore[attr-defined]
        if found is None:
            return None
        return {str(k): (None if v is None else str(v)) for k, v in found.groupdict().items()}


def _construct(pattern: str, message: str) -> str:
    """What of ``pattern`` RE2 refused, in words, from RE2's own parser message."""
    kind, _, where = message.partition(": ")
    if kind == "invalid perl operator":
        if where.startswith("(?P") and "(?P=" in pattern:
            return "a named backreference (?P=name)"
        if where in _PERL_OPERATORS:
            return _PERL_OPERATORS[where]
    if kind == "invalid escape sequence":
        if re.fullmatch(r"\\[1-9]", where):
            return f"a backreference {where}"
        if where in ("\\k", "\\g"):
            return f"a backreference {where}<...>"
        return f"the escape {where}"
    if kind == "bad repetition operator" and where.endswith("+") and len(where) == 2:
        return f"a possessive quantifier {where}"
    if kind == "invalid repetition size":
        return f"the repetition {where} (at most {_MAX_REPEAT})"
    return ""


def compile_user_regex(pattern: str, *, max_chars: int, limit_name: str) -> UserRegex:
    """Compile ``pattern`` for RE2. :class:`UserRegexError` when it is longer than
    ``max_chars`` (the message names ``limit_name``, the setting or constant that bounds it)
    or when RE2 cannot compile it (the message names the construct)."""
    if len(pattern) > max_chars:
        raise UserRegexError(
            f"regex of {len(pattern)} characters is over the limit of {max_chars} ({limit_name})"
        )
    for found in _REPETITION.finditer(pattern):
        counts = [c for c in found.groups() if c]
        if any(len(c) > 4 or int(c) > _MAX_REPEAT for c in counts):
            raise UserRegexError(
                f"regex {pattern!r} uses the repetition {found.group(0)} (at most "
                f"{_MAX_REPEAT}), which is not supported ({_NOT_LINEAR})"
            )
    return _compile(pattern)


@functools.lru_cache(maxsize=1024)
def _compile(pattern: str) -> UserRegex:
    # Cached: a silence's matchers are asked for every alert while it is active.
    options = re2.Options()
    options.log_errors = False  # our own message says why; RE2's would go to stderr
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as exc:
        raw = exc.args[0] if exc.args else ""
        message = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        construct = _construct(pattern, message)
        if construct:
            raise UserRegexError(
                f"regex {pattern!r} uses {construct}, which is not supported ({_NOT_LINEAR})"
            ) from None
        raise UserRegexError(f"regex {pattern!r} is not valid for RE2: {message}") from None
    return UserRegex(pattern, compiled)
