"""Property-based tests: ``recover()`` agrees with a plain model of entry statuses."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from recovery.wal import StepType, WALError, WALStatus, WriteAheadLog

# The on-disk record format, on purpose: these tests read, cut and forge segment bytes.
from recovery.wal._format import HEADER, scan

pytestmark = pytest.mark.timeout(240)

ids = st.text(alphabet="abcdefgh-_/é0123", min_size=1, max_size=6).filter(lambda s: s.strip())
statuses = st.sampled_from(list(WALStatus))


class WALModel(RuleBasedStateMachine):
    """Random appends, status changes, compactions and reopenings against a dict model."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="walprop-"))
        self.wal = WriteAheadLog(self.root, sync=False, segment_bytes=1024)
        self.model: dict[str, WALStatus] = {}  # insertion order = append order

    @rule(entry_id=ids, step=st.sampled_from(list(StepType)))
    def append(self, entry_id: str, step: StepType) -> None:
        if entry_id in self.model:
            with pytest.raises(WALError, match="already in the log"):
                self.wal.append(entry_id, step)
        else:
            self.wal.append(entry_id, step)
            self.model[entry_id] = WALStatus.PENDING

    @rule(entry_id=ids, status=statuses)
    def update(self, entry_id: str, status: WALStatus) -> None:
        current = self.model.get(entry_id)
        if current is None:
            with pytest.raises(WALError, match="unknown entry"):
                self.wal.update_status(entry_id, status)
        elif current is WALStatus.COMPLETED and status is not WALStatus.COMPLETED:
            with pytest.raises(WALError, match="COMPLETED"):
                self.wal.update_status(entry_id, status)
        else:
            self.wal.update_status(entry_id, status)
            self.model[entry_id] = status

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), status=statuses)
    def update_existing(self, data: st.DataObject, status: WALStatus) -> None:
        self.update(data.draw(st.sampled_from(sorted(self.model))), status)

    @rule(entry_ids=st.lists(ids, min_size=1, max_size=4))
    def append_many(self, entry_ids: list[str]) -> None:
        if len(set(entry_ids)) < len(entry_ids):
            with pytest.raises(WALError, match="given twice"):
                self.wal.append_many([(e, "generate") for e in entry_ids])
        elif any(e in self.model for e in entry_ids):
            with pytest.raises(WALError, match="already in the log"):
                self.wal.append_many([(e, "generate") for e in entry_ids])
        else:
            self.wal.append_many([(e, "generate") for e in entry_ids])
            self.model.update(dict.fromkeys(entry_ids, WALStatus.PENDING))

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def update_many(self, data: st.DataObject) -> None:
        """Several changes in one call: all of them apply, in order, or none does."""
        changes = data.draw(
            st.lists(st.tuples(st.sampled_from(sorted(self.model) + ["zz"]), statuses), max_size=4)
        )
        after = dict(self.model)
        refused = None
        for eid, status in changes:
            current = after.get(eid)
            if current is None:
                refused = "unknown entry"
                break
            if current is WALStatus.COMPLETED and status is not WALStatus.COMPLETED:
                refused = "COMPLETED"
                break
            after[eid] = status
        if refused is not None:
            with pytest.raises(WALError, match=refused):
                self.wal.update_many(changes)
        else:
            self.wal.update_many(changes)
            self.model = after

    @rule()
    def compact(self) -> None:
        self.wal.compact()
        self.model = {k: v for k, v in self.model.items() if v is not WALStatus.COMPLETED}

    @rule()
    def reopen(self) -> None:
        self.wal.close()
        self.wal = WriteAheadLog(self.root, sync=False, segment_bytes=1024)

    @invariant()
    def recover_matches_model(self) -> None:
        expected = [(k, v) for k, v in self.model.items() if v is not WALStatus.COMPLETED]
        assert [(e.entry_id, e.status) for e in self.wal.recover()] == expected
        completed = {k for k, v in self.model.items() if v is WALStatus.COMPLETED}
        assert {e.entry_id for e in self.wal.entries()} - {k for k, _ in expected} == completed

    def teardown(self) -> None:
        self.wal.close()
        shutil.rmtree(self.root, ignore_errors=True)


WALModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWALModel = WALModel.TestCase


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.tuples(st.integers(0, 7), statuses), min_size=1, max_size=30),
    cut_fraction=st.floats(0.0, 1.0),
)
def test_any_truncation_recovers_a_prefix_of_the_changes(
    ops: list[tuple[int, WALStatus]], cut_fraction: float
) -> None:
    """Cutting the log anywhere yields exactly the state after the last whole record."""
    root = Path(tempfile.mkdtemp(prefix="walcut-"))
    try:
        wal = WriteAheadLog(root, sync=False)
        segment = next(root.glob("wal-*.log"))
        snapshots: list[tuple[int, dict[str, WALStatus]]] = [(0, {})]
        model: dict[str, WALStatus] = {}
        for index, status in ops:
            eid = f"e{index}"
            if eid not in model:
                if index % 2:
                    wal.append(eid, "generate")
                    model[eid] = WALStatus.PENDING
                else:  # a group record: its two entries come back together or not at all
                    wal.append_many([(eid, "generate"), (f"{eid}-pair", "reward")])
                    model[eid] = model[f"{eid}-pair"] = WALStatus.PENDING
            elif model[eid] is not WALStatus.COMPLETED:
                wal.update_status(eid, status)
                model[eid] = status
            snapshots.append((scan(segment.read_bytes()).valid_end, dict(model)))
        wal.close()
        content = segment.read_bytes()
        # Cuts anywhere in the records and a little into the preallocated zeros after them.
        cut = int((snapshots[-1][0] + HEADER.size + 4) * cut_fraction)
        segment.write_bytes(content[:cut])
        expected = [m for end, m in snapshots if end <= cut][-1]
        with WriteAheadLog(root, sync=False) as reopened:
            assert {e.entry_id: e.status for e in reopened.entries()} == expected
            assert [e.entry_id for e in reopened.recover()] == [
                k for k, v in expected.items() if v is not WALStatus.COMPLETED
            ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
