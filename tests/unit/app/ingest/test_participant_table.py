"""The participant table the policy reads (app/ingest/participant_table.py): latest heartbeat
wins, and a node keeps only its most recently reported participants."""

from __future__ import annotations

from app.ingest.participant_table import ParticipantTable
from recovery.protocol.samples import ParticipantReport


def rep(job: str, rank: int, ts: float, phase: str = "TRAIN") -> ParticipantReport:
    return ParticipantReport(job, "trainer", rank, phase, 1, ts)


def test_a_node_keeps_its_most_recently_reported_participants() -> None:
    table = ParticipantTable(keep_per_node=4)
    table.report("n1", [rep("old", r, 1.0, "EXITED") for r in range(4)])
    table.report("n2", [rep("other", 0, 1.0)])
    table.report("n1", [rep("old", 3, 2.0)])  # reported again: the most recent now
    table.report("n1", [rep("new", r, 3.0) for r in range(3)])
    kept = table.snapshot()
    assert sorted(k for k in kept if k[0] != "other") == [
        ("new", "trainer", 0),
        ("new", "trainer", 1),
        ("new", "trainer", 2),
        ("old", "trainer", 3),
    ]
    assert ("other", "trainer", 0) in kept  # another node's share is its own


def test_the_newest_heartbeat_wins_and_a_moved_participant_stays() -> None:
    table = ParticipantTable(keep_per_node=1)
    table.report("n1", [rep("j", 0, 5.0)])
    table.report("n1", [rep("j", 0, 4.0, "ROLLOUT")])  # an older heartbeat, late
    assert table.snapshot()[("j", "trainer", 0)].phase == "TRAIN"
    table.report("n2", [rep("j", 0, 6.0)])  # the process moved to n2
    table.report("n1", [rep("k", 0, 7.0)])  # n1 forgets j/0 from its share: n2 has it now
    kept = table.snapshot()
    assert kept[("j", "trainer", 0)].node == "n2" and ("k", "trainer", 0) in kept
    assert len(table) == 2
