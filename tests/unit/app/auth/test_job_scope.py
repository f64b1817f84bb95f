"""app.auth.job_scope: glob patterns of the jobs a node token may report."""

from __future__ import annotations

import pytest

from app.auth.job_scope import MAX_JOB_PATTERNS, JobScope, parse_job_patterns
from app.auth.tokens import NodeIdentity
from app.core.errors import InvalidInput
from app.ingest.validation import IngestRejected, ValidBatch
from app.series.store import SeriesKey
from recovery.protocol.samples import ParticipantReport

pytestmark = pytest.mark.timeout(30)


def scope(*patterns: str) -> JobScope:
    made = JobScope.of(parse_job_patterns(list(patterns)))
    assert made is not None
    return made


@pytest.mark.parametrize(
    ("patterns", "job", "allowed"),
    [
        (["team-a-*"], "team-a-grpo", True),
        (["team-a-*"], "team-a-", True),
        (["team-a-*"], "team-b-grpo", False),
        (["team-a-*"], "xteam-a-grpo", False),  # anchored at both ends
        (["team-a-?"], "team-a-7", True),
        (["team-a-?"], "team-a-77", False),
        (["a.b"], "aXb", False),  # only * and ? are special
        (["a.b"], "a.b", True),
        (["team-a-*", "shared/eval-*"], "shared/eval-3", True),
        (["*"], "anything:at@all", True),
    ],
)
def test_globs_match_whole_job_names(patterns: list[str], job: str, allowed: bool) -> None:
    assert scope(*patterns).allows(job) is allowed


def test_many_stars_against_a_long_name_is_answered() -> None:
    # Translated to a backtracking regex, ``*a*a*...b`` against ``aaaa...`` is exponential;
    # compiled for RE2 it is linear.
    assert not scope("*a" * 60 + "b").allows("a" * 128)


@pytest.mark.parametrize(
    ("patterns", "named"),
    [
        ([], "at least one pattern"),
        (["team a"], "job pattern 'team a'"),
        (["-*"], "job pattern '-*'"),
        (["team-[ab]-*"], "job pattern 'team-[ab]-*'"),
        (["x" * 129], "1-128 characters"),
        ([f"j{i}" for i in range(MAX_JOB_PATTERNS + 1)], f"at most {MAX_JOB_PATTERNS}"),
    ],
)
def test_bad_patterns_are_named(patterns: list[str], named: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_job_patterns(patterns)
    assert named in str(err.value)


def test_duplicates_are_dropped_and_unscoped_is_none() -> None:
    assert parse_job_patterns(["a-*", "b", "a-*"]) == ["a-*", "b"]
    assert JobScope.of(None) is None


def batch(jobs: list[str], sample_jobs: list[str]) -> ValidBatch:
    participants = [ParticipantReport(j, "trainer", 0, "TRAIN", 1, 1.0) for j in jobs]
    samples = [
        (SeriesKey("n1", "rollout_pending_ratio", (("job", j),)), 1.0, 0.1) for j in sample_jobs
    ]
    samples.append((SeriesKey("n1", "gpu_util", (("gpu", "0"),)), 1.0, 50.0))
    return ValidBatch("a", "n1", 0, 1.0, samples, participants, None)


def test_a_batch_naming_a_job_outside_the_scope_is_refused_naming_it() -> None:
    who = NodeIdentity("n1", 1, scope("team-a-*"))
    who.check_batch(batch(["team-a-1"], ["team-a-2"]))
    for jobs, sample_jobs, outside in [
        (["team-a-1", "team-b-1"], [], "team-b-1"),
        (["team-a-1"], ["team-c-9"], "team-c-9"),  # a series' job label names a job too
    ]:
        with pytest.raises(IngestRejected) as err:
            who.check_batch(batch(jobs, sample_jobs))
        assert err.value.status_code == 403 and err.value.kind == "job_out_of_scope"
        assert f"job {outside!r} is outside this node token's job scope (team-a-*)" in str(
            err.value
        )
    NodeIdentity("n1", 2).check_batch(batch(["team-b-1"], ["anything"]))  # unscoped
