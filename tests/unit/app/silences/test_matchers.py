from __future__ import annotations

import pytest

from app.core.errors import InvalidInput
from app.models.incident import Incident
from app.silences.matchers import Matcher, all_match, incident_labels, parse_matchers


def gpu_incident() -> Incident:
    return Incident(
        key="gpu_xid:node=n1/gpu=3",
        kind="gpu_xid",
        tier="medium",
        subject={"node": "n1", "gpu": "3", "job": "grpo-a", "role": "rollout", "rank": 2},
        job="grpo-a",
        node="n1",
    )


LABELS = incident_labels(gpu_incident())


def test_incident_labels_are_the_six_silence_labels() -> None:
    assert LABELS == {
        "job": "grpo-a", "node": "n1", "role": "rollout", "rank": "2", "kind": "gpu_xid",
        "tier": "medium",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("text", "hit"),
    [
        ("node=n1", True),
        ("node=n10", False),
        ("node!=n1", False),
        ("node!=n2", True),
        ("job=~grpo-.*", True),
        ("job=~grpo", False),  # anchored at both ends, as Alertmanager anchors
        ("node=~n", False),
        ("rank!~[01]", True),
        ("kind!~gpu_.*", False),
        ("tier=medium", True),
        ("role=trainer", False),
    ],
)
def test_one_matcher(text: str, hit: bool) -> None:
    assert Matcher.parse_text(text).matches(LABELS) is hit


def test_all_matchers_must_match() -> None:
    both = [Matcher.parse_text("node=n1"), Matcher.parse_text("kind=gpu_xid")]
    assert all_match(both, LABELS)
    assert not all_match([*both, Matcher.parse_text("tier=heavy")], LABELS)


def test_a_missing_label_matches_as_empty() -> None:
    node_level = {"node": "n1", "kind": "node_silent", "tier": "heavy"}
    assert Matcher.parse_text("rank!=0").matches(node_level)
    assert not Matcher.parse_text("rank=0").matches(node_level)


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ([], "at least one matcher"),
        ([{"label": "gpu", "value": "3"}], "unknown label 'gpu'"),
        ([{"label": "node", "op": "==", "value": "n1"}], "unknown operator '=='"),
        ([{"label": "job", "op": "=~", "value": "grpo-(a"}], "bad regex"),
        ([{"label": "job", "op": "=~", "value": ".*"}], "match an empty label"),
        ([{"label": "node", "op": "!=", "value": "n1"}], "match an empty label"),
    ],
)
def test_refused_matchers_name_the_reason(raw: list[dict[str, str]], named: str) -> None:
    with pytest.raises(InvalidInput, match=named):
        parse_matchers(raw)


def test_a_narrowing_matcher_makes_broad_ones_acceptable() -> None:
    ms = parse_matchers(
        [{"label": "node", "value": "n1"}, {"label": "job", "op": "=~", "value": ".*"}]
    )
    assert [str(m) for m in ms] == ["node=n1", "job=~.*"]


def test_text_form_names_a_bad_matcher() -> None:
    with pytest.raises(InvalidInput, match="'nodes1'"):
        Matcher.parse_text("nodes1")


def test_a_nested_quantifier_against_a_long_label_is_answered() -> None:
    # On Python's backtracking engine this is 2^100 steps; RE2 answers in linear time.
    matcher = Matcher.parse_text("job=~(a+)+")
    assert not matcher.matches({"job": "a" * 100 + "-b"})
    assert matcher.matches({"job": "a" * 100})


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("grpo-(?=a).*", "a lookahead"),
        (r"(grpo)-\1", "a backreference \\1"),
        ("(?<!x)y", "lookbehind"),
    ],
)
def test_a_regex_re2_cannot_run_is_refused_naming_it(value: str, named: str) -> None:
    with pytest.raises(InvalidInput) as err:
        Matcher.parse({"label": "job", "op": "=~", "value": value})
    assert str(err.value).startswith("matcher job=~: bad regex: ") and named in str(err.value)


def test_a_new_silences_regex_is_bounded_by_the_setting() -> None:
    raw = [{"label": "job", "op": "=~", "value": "grpo-" + "a" * 20}]
    assert parse_matchers(raw, max_regex_chars=25)
    with pytest.raises(
        InvalidInput, match="26 characters is over the limit of 25 .*MAX_REGEX_CHARS"
    ):
        parse_matchers([{**raw[0], "value": raw[0]["value"] + "b"}], max_regex_chars=25)
