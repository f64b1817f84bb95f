"""recovery.user_regex: user patterns on RE2, refused by name when RE2 cannot run them."""

from __future__ import annotations

import pytest

from recovery.user_regex import UserRegexError, compile_user_regex

pytestmark = pytest.mark.timeout(30)


def compiled(pattern: str, max_chars: int = 300):  # type: ignore[no-untyped-def]
    return compile_user_regex(pattern, max_chars=max_chars, limit_name="test.limit")


def test_nested_quantifiers_on_a_long_non_matching_value_finish() -> None:
    # Python's backtracking engine needs 2^n steps here (n=50_000): this test would not end.
    value = "a" * 50_000 + "!"
    assert compiled("(a+)+").fullmatch(value) is False
    assert compiled("(a|aa)+$").search(value) is None
    assert compiled("(a+)+").fullmatch("a" * 50_000) is True


def test_fullmatch_is_anchored_at_both_ends_and_search_returns_named_groups() -> None:
    assert compiled("gpu-1").fullmatch("gpu-10") is False
    assert compiled("gpu-1.*").fullmatch("gpu-10") is True
    assert compiled(r"_server_(?P<rank>\d+)_").search("vllm_server_3_1") == {"rank": "3"}
    assert compiled("^Worker$").search("WorkerDict") is None
    assert compiled("Worker").search("WorkerDict") == {}
    assert compiled(r"a{2,1000}\{99999}").fullmatch("aa{99999}")  # an escaped brace is literal


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        ("grpo-(?=a)", "a lookahead (?=...)"),
        ("grpo-(?!a)", "a negative lookahead (?!...)"),
        ("(?<=a)b", "a lookbehind (?<=...)"),
        ("(?<!a)b", "a negative lookbehind (?<!...)"),
        (r"(a)\1", r"a backreference \1"),
        ("(?P<x>a)(?P=x)", "a named backreference (?P=name)"),
        (r"(?P<x>a)\k<x>", r"a backreference \k<...>"),
        ("(?>a)", "an atomic group"),
        ("a*+", "a possessive quantifier *+"),
        ("a{2000}", "the repetition {2000}"),
        ("a{4294967296}", "the repetition {4294967296} (at most 1000)"),  # wraps in RE2's parser
        ("a{1,99999999999}", "the repetition {1,99999999999}"),
        ("(grpo", "missing )"),
    ],
)
def test_what_re2_cannot_run_is_refused_naming_the_construct(pattern: str, named: str) -> None:
    with pytest.raises(UserRegexError) as err:
        compiled(pattern)
    assert named in str(err.value) and repr(pattern) in str(err.value)


def test_the_length_limit_names_its_setting() -> None:
    assert compiled("a" * 10, max_chars=10).fullmatch("a" * 10)
    with pytest.raises(
        UserRegexError, match=r"11 characters is over the limit of 10 \(test.limit\)"
    ):
        compiled("a" * 11, max_chars=10)


def test_span_is_the_first_match_anywhere() -> None:
    assert compiled("out of memory").span("CUDA out of memory. Tried") == (5, 18)
    assert compiled("(a+)+b").span("a" * 50_000) is None
