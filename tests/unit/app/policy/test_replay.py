from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from app.policy.engine import DecisionType
from app.policy.replay import TraceError, format_report, read_trace, replay, replay_file

pytestmark = pytest.mark.timeout(60)

CORPUS = Path(__file__).resolve().parents[3] / "policy_traces"


def _batch(node: str, t: float, seq: int, **extra) -> dict:
    b = {
        "agent_id": f"a-{node}",
        "node": node,
        "seq": seq,
        "sent_at": t,
        "samples": [],
        "participants": [],
        "fingerprint": None,
    }
    b.update(extra)
    return b


def test_replay_finds_the_silent_node_faster_than_real_time(tmp_path: Path) -> None:
    lines = []
    for i in range(200):
        lines.append(_batch("n0", 1000.0 + i, i + 1))
        if i < 50:
            lines.append(_batch("n1", 1000.0 + i, i + 1))
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(b) for b in lines) + "\n")
    result, sc = replay_file(trace)
    assert sc is None
    [opened] = result.opened
    assert opened.key == "node_silent:node=n1"
    assert opened.detection_delay == pytest.approx(75, abs=1.01)
    assert result.trace_seconds == 199 and result.wall_seconds < 10
    text = "\n".join(format_report(result))
    assert "node_silent:node=n1 detected after 75" in text


def test_report_prints_times_in_milliseconds_as_the_engine_saw_them(tmp_path: Path) -> None:
    # n1 goes silent 375 ms into a second: the delay the engine measured is 75.625 s, which a
    # report in whole (or tenth) seconds would round away.
    lines = []
    for i in range(200):
        lines.append(_batch("n0", 1000.0 + i, i + 1))
        if i < 50:
            lines.append(_batch("n1", 1000.375 + i, i + 1))
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(b) for b in lines) + "\n")
    result, _ = replay_file(trace)
    [opened] = result.opened
    assert opened.detection_delay == pytest.approx(75.625)
    [line] = [x for x in format_report(result) if "node_silent" in x]
    assert line.startswith(f"t+{opened.at - result.start_ts:.3f} ")
    assert "detected after 75.625s" in line


def test_speed_paces_the_replay_clock() -> None:
    slept: list[float] = []
    batches = [_batch("n0", 10.0 + i, i + 1) for i in range(11)]
    res = replay(batches, speed=100.0, sleep=slept.append)
    assert res.ticks == 10
    assert sum(slept) == pytest.approx(10 / 100.0)
    with pytest.raises(ValueError, match="speed must be positive, got 0"):
        replay(batches, speed=0)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "t.jsonl:2: not JSON"),
        ("[1, 2]", "t.jsonl:2: a batch must be a JSON object"),
        ('{"node": "n0", "samples": []}', "t.jsonl:2: field 'sent_at' missing"),
        ('{"node": 3, "sent_at": 1, "samples": []}', "t.jsonl:2: field 'node'"),
    ],
)
def test_bad_trace_line_is_named(tmp_path: Path, line: str, needle: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(_batch("n0", 1.0, 1)) + "\n" + line + "\n")
    with pytest.raises(TraceError, match=needle.replace("(", r"\(")):
        list(read_trace(trace))


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="trace file not found"):
        replay_file(tmp_path / "nope.jsonl")


def test_gzip_traces_and_labels_are_read(tmp_path: Path) -> None:
    src = CORPUS / "fault_gpu_xid_0.jsonl.gz"
    result, sc = replay_file(src)
    assert sc is not None and sc.recall == 1.0 and sc.precision == 1.0
    assert any(d.type is DecisionType.OPEN and d.kind.value == "gpu_xid" for d in result.decisions)
    with gzip.open(src, "rt") as fh:
        assert json.loads(fh.readline())["node"] == "n0"
