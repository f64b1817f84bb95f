"""One opened incident decision per fault kind, as the policy engine makes them from the
labelled trace corpus (``tests/policy_traces``): real signals, with the evidence their
detectors really attach, for tests of how incidents are shown (the Evidence panel, the pages).
"""

from __future__ import annotations

import functools
from pathlib import Path

from app.policy.engine import IncidentDecision
from app.policy.replay import replay_file

CORPUS = Path(__file__).resolve().parents[1] / "policy_traces"


@functools.lru_cache(maxsize=1)
def first_opened_per_kind() -> dict[str, IncidentDecision]:
    """For every kind the corpus's fault traces open (the first trace of each family), the first
    incident opened of it, with its signal. Replaying takes ~20 s on an idle core."""
    out: dict[str, IncidentDecision] = {}
    for trace in sorted(CORPUS.glob("fault_*_0.jsonl.gz")):
        result, _score = replay_file(trace)
        for decision in result.opened:
            if decision.signal is not None:
                out.setdefault(decision.kind.value, decision)
    return out
