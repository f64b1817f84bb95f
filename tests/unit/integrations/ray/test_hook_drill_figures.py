"""The Ray hook's ``drill_figures``: the generations a drill made a job redo, counted from the
job's run directory on this node as the supervisor's hook counts them (no Ray needed), a note
instead of a number where it knows no run directory, and bad arguments refused by name."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from integrations.ray.hook import main

BASE = ["--idempotency-key=drill-3-figures", "--dashboard=http://127.0.0.1:1"]


def _run(tmp_path: Path, *args: str) -> list[str]:
    return [*args, *BASE, f"--state-dir={tmp_path / 'state'}"]


def _answer(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    out = capsys.readouterr().out.strip()
    return json.loads(out)  # type: ignore[no-any-return]


def test_counts_the_rollouts_lost_since_the_injection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RLGUARD_RECOVERY_RUN_ROOT", raising=False)
    run = tmp_path / "runs" / "ref"
    (run / "wal").mkdir(parents=True)
    now = time.time()
    events = [
        {"ts": now - 100, "kind": "lost_rollout", "samples": 8},  # before the drill
        {"ts": now, "kind": "lost_rollout", "samples": 8},
        {"ts": now + 1, "kind": "step", "step": 4},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    code = main(
        _run(
            tmp_path,
            "drill_figures",
            "--job=ref",
            f"--run-root={tmp_path / 'runs'}",
            f"--extra={json.dumps({'since': now - 1})}",
        )
    )
    assert code == 0
    answer = _answer(capsys)
    assert answer["generations_redone"] == 8 and answer["batches_redone"] == 1, answer
    assert answer["unit"] == "rollouts"


def test_without_a_run_root_the_answer_says_why_there_is_no_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RLGUARD_RECOVERY_RUN_ROOT", raising=False)
    assert main(_run(tmp_path, "drill_figures", "--job=ref", '--extra={"since": 1}')) == 0
    answer = _answer(capsys)
    assert answer["generations_redone"] is None
    assert str(answer["note"]).startswith("not measured: the launcher hook knows no run directory")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--job=../etc", '--extra={"since": 1}'], "--job '../etc' cannot name a run directory"),
        (
            ["--job=ref", '--extra={"since": true}'],
            "drill_figures needs --extra='{\"since\": EPOCH_SECONDS}', got {'since': True}",
        ),
        (["--job=ref"], "drill_figures needs --extra='{\"since\": EPOCH_SECONDS}', got {}"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(_run(tmp_path, "drill_figures", f"--run-root={tmp_path}", *args))
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err
