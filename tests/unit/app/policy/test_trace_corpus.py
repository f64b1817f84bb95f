"""Detector quality on the labelled trace corpus: precision, recall, detection delay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.policy.replay import Score, labels_path, read_trace, replay, score
from app.policy.signals import FaultKind
from tests.policy_traces import make_traces

CORPUS = Path(make_traces.__file__).parent
TRACES = sorted(CORPUS.glob("*.jsonl.gz"))


@pytest.mark.timeout(120)
def test_corpus_precision_recall_and_delay() -> None:
    total = Score()
    kinds: set[str] = set()
    negatives = 0
    for trace in TRACES:
        labels = json.loads(labels_path(trace).read_text())
        kinds.update(e["kind"] for e in labels["expect"])
        negatives += not labels["expect"]
        total.add(score(replay(read_trace(trace)), labels))
    assert total.expected >= 40 and negatives >= 10
    # every kind a detector can raise from the agent's data is in the corpus
    assert kinds == {k.value for k in FaultKind} - {"external_alert"}
    assert total.precision >= 0.98, total.false_positive
    assert total.recall >= 0.98, total.missed
    assert total.false_heavy == []
    assert total.late == []  # every delay ≤ the configured window + 2 s
    assert max(total.delays) <= 300 + 2


@pytest.mark.timeout(120)
def test_corpus_matches_its_generator(tmp_path: Path) -> None:
    n = make_traces.main(tmp_path)
    assert n == len(TRACES)
    for trace in TRACES:
        assert (tmp_path / trace.name).read_bytes() == trace.read_bytes(), trace.name
        lp = labels_path(trace)
        assert (tmp_path / lp.name).read_text() == lp.read_text()
