"""verl's file logger lines as job signals.

The lines are written as verl's ``FileLogger.log`` writes them (``verl/utils/tracking.py`` at
commit b178a3cd56f58b2d502255daba591e92833930a7: ``orjson.dumps({"step": step, "data": data},
option=OPT_SERIALIZE_NUMPY) + b"\\n"`` to a file opened ``wb``). verl itself is not installed by
the project: ``pip install verl`` would replace the transformers the TRL extra pins.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from integrations.ray.verl_log import VerlLineInvalid, VerlLogTail, parse_line


def verl_line(step: int, data: dict) -> bytes:
    return orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def test_documented_keys_become_signals() -> None:
    step, signals = parse_line(
        verl_line(
            12,
            {
                "perf/throughput": 1520.5,
                "perf/time_per_step": 4.0,
                "timing_s/gen": 3.0,
                "timing_s/update_actor": 1.0,
                "response_length/mean": 311.0,
                "fully_async/partial/partial_ratio": 0.125,
                "fully_async/count/stale_samples_processed": 9,
                "fully_async/count/dropped_stale_samples": 2,
                "actor/pg_loss": 0.3,
                "val/flag": True,
            },
        )
    )
    assert step == 12
    assert signals == {
        "train_step": 12.0,
        "train_throughput_tokens_per_second": 1520.5,
        "train_step_seconds": 4.0,
        "train_phase_generate_seconds": 3.0,
        "train_phase_update_seconds": 1.0,
        "train_phase_generate_ratio": 0.75,
        "rollout_response_length_mean": 311.0,
        "rollout_pending_ratio": 0.125,
        "rollout_stale_samples_total": 9.0,
        "rollout_dropped_stale_samples_total": 2.0,
    }


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"{not json", "not JSON"),
        (b'{"step": 1}', "not {'step'"),
        (b'{"step": -1, "data": {}}', "step must be"),
    ],
)
def test_lines_that_are_not_verls_are_refused(line: bytes, why: str) -> None:
    with pytest.raises(VerlLineInvalid, match=why):
        parse_line(line)


def test_tail_follows_appends_partial_lines_and_a_restarted_file(tmp_path: Path) -> None:
    path = tmp_path / "verl.jsonl"
    tail = VerlLogTail(path, job="j", clock=lambda: 5.0)
    assert tail.collect() == []  # no file yet
    with open(path, "wb", buffering=0) as fp:
        fp.write(verl_line(1, {"perf/throughput": 10.0}))
        fp.write(b"garbage\n")
        fp.write(verl_line(2, {"perf/throughput": 20.0})[:10])  # half a line
        got = {s["name"]: s["value"] for s in tail.collect()}
        assert got == {"train_step": 1.0, "train_throughput_tokens_per_second": 10.0}
        assert tail.bad_lines == 1
        fp.write(verl_line(2, {"perf/throughput": 20.0})[10:])
        assert tail.step is None or tail.step == 1
        tail.collect()
        assert tail.step == 2
    with open(path, "wb", buffering=0) as fp:  # a restarted trainer opens it "wb" again
        fp.write(verl_line(0, {"perf/throughput": 5.0}))
    samples = tail.collect()
    assert (
        tail.step == 0
        and {s["name"]: s["value"] for s in samples}["train_throughput_tokens_per_second"] == 5.0
    )
    assert samples[0]["labels"] == {"job": "j", "role": "trainer", "rank": "0"}
