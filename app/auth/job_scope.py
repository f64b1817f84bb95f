"""A node token's job scope: the job names its batches may report.

On a shared cluster one team's node must not report participants (or series) of another team's
job: the incidents they open would plan actions against that job. A node token may carry
glob patterns (``team-a-*``; ``*`` any run of characters, ``?`` one character, nothing else
special); every job a batch names, in its participants and in its samples' ``job`` label, must
match one of them, or the whole batch is refused with 403 naming the job, before any of it is
applied. A token without patterns is unscoped: any job, as before.

The patterns are globs, never regexes: each is translated with everything but its wildcards
escaped and compiled for RE2 (``recovery.user_regex``), so matching costs time linear in the job
name whatever an admin typed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from app.core.errors import InvalidInput
from app.ingest.validation import IngestRejected, ValidBatch
from app.ingest.wire_rules import ID_PATTERN
from recovery.protocol.metric_names import LABEL_JOB
from recovery.user_regex import UserRegex, compile_user_regex

# Every job a token may be scoped to is checked on every batch: keep the list short.
MAX_JOB_PATTERNS = 32
MAX_PATTERN_CHARS = 128  # a job name's own limit (ingest's max_id_length ceiling)
# A pattern is a job name with wildcards: the ingest identifier characters plus * and ?.
_GLOB = re.compile(r"[A-Za-z0-9_.:@/*?-]+")
_JOB = re.compile(ID_PATTERN)


def parse_job_patterns(patterns: Sequence[str]) -> list[str]:
    """The patterns as stored (order kept, duplicates dropped); InvalidInput (422) names the
    first bad one. An empty list is refused: it would scope a token to no job at all."""
    if not patterns:
        raise InvalidInput("a job scope needs at least one pattern (omit it for any job)")
    if len(patterns) > MAX_JOB_PATTERNS:
        raise InvalidInput(f"{len(patterns)} job patterns: at most {MAX_JOB_PATTERNS}")
    out: list[str] = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not 1 <= len(pattern) <= MAX_PATTERN_CHARS:
            raise InvalidInput(
                f"job pattern {pattern!r}: 1-{MAX_PATTERN_CHARS} characters of a job name"
            )
        as_name = pattern.replace("*", "x").replace("?", "x")  # where a name could start
        if not _GLOB.fullmatch(pattern) or not _JOB.fullmatch(as_name):
            raise InvalidInput(
                f"job pattern {pattern!r}: letters, digits, _.:@/- and the wildcards * and ? "
                "(not starting with . : @ / -)"
            )
        if pattern not in out:
            out.append(pattern)
    return out


def _glob_regex(patterns: Sequence[str]) -> UserRegex:
    alternatives = "|".join(
        "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in p)
        for p in patterns
    )
    # Bounded by MAX_JOB_PATTERNS x MAX_PATTERN_CHARS escaped characters and the parentheses.
    limit = MAX_JOB_PATTERNS * (2 * MAX_PATTERN_CHARS + 1) + 4
    return compile_user_regex(f"(?:{alternatives})", max_chars=limit, limit_name="job patterns")


@dataclass(frozen=True, slots=True)
class JobScope:
    """The job patterns of one token, compiled once (the token cache keeps it)."""

    patterns: tuple[str, ...]
    _regex: UserRegex

    @classmethod
    def of(cls, patterns: Sequence[str] | None) -> JobScope | None:
        """The scope of a token's stored patterns; None for an unscoped token."""
        if patterns is None:
            return None
        return cls(tuple(patterns), _glob_regex(patterns))

    def allows(self, job: str) -> bool:
        return self._regex.fullmatch(job)

    def check_batch(self, batch: ValidBatch) -> None:
        """Refuse (403) a batch that names a job outside the scope, naming the job."""
        jobs = {p.job for p in batch.participants}
        jobs.update(
            job for key, _ts, _value in batch.samples if (job := key.label(LABEL_JOB)) is not None
        )
        outside = sorted(job for job in jobs if not self.allows(job))
        if outside:
            raise IngestRejected(
                f"job {outside[0]!r} is outside this node token's job scope "
                f"({', '.join(self.patterns)}); nothing of the batch was applied",
                status_code=403,
                kind="job_out_of_scope",
            )
