"""The engine host (``python -m integrations.vllm.host``): bad arguments are refused before
anything starts, and a new host kills what is left of its rank's previous engine tree, never a
stranger that was given one of its pids again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from integrations.vllm.host import Participant, _kill_previous
from workload.engines.records import _running

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    return directory


def _host(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "integrations.vllm.host", *args],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--port", "8000"], {}, "--model"),
        (["--model", "{model}", "--port", "70000"], {}, "'70000' is not a TCP port"),
        (["--model", "{model}", "--port", "http"], {}, "'http' is not a whole number"),
        (["--model", "{model}", "--port", "8000", "--start-timeout", "0"], {}, "'0' must be a"),
        (["--model", "{model}", "--port", "8000", "--max-model-len", "-4"], {}, "'-4' must be"),
        (["--model", "{empty}", "--port", "8000"], {}, "not a model directory (no config.json)"),
        (["--model", "{model}", "--port", "8000", "stray"], {}, "unexpected argument 'stray'"),
        (["--model", "{model}", "--port", "8000"], {"RLGUARD_RUN_DIR": ""}, "RLGUARD_RUN_DIR"),
        (["--model", "{model}", "--port", "8000"], {"RANK": "one"}, "RANK='one'"),
        (["--model", "{model}", "--port", "8000"], {"RLGUARD_JOB": "a b"}, "RLGUARD_JOB='a b'"),
    ],
)
def test_bad_arguments_are_refused_naming_the_value_and_nothing_starts(
    args: list[str], env: dict[str, str], named: str, model: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [a.format(model=model, empty=empty) for a in args]
    done = _host(argv, {"RLGUARD_RUN_DIR": str(run_dir), "RANK": "0", "RLGUARD_JOB": "j", **env})
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("python -m integrations.vllm.host: error: ") and named in line, line
    assert not run_dir.exists()  # no heartbeat, no announcement, no engine


def _sleepers(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["sleep", "60"]) for _ in range(count)]


def _announce(who: Participant, pids: list[int], written: float) -> None:
    who.announcement.parent.mkdir(parents=True, exist_ok=True)
    body = {"url": "http://127.0.0.1:1", "engine": "vllm", "ready": True, "host_pid": pids[0],
            "pids": {"api_server": pids[1], "engine_core": pids[2]}, "written": written}  # fmt: skip
    who.announcement.write_text(json.dumps(body))


def test_a_new_host_kills_the_previous_tree_left_behind(tmp_path: Path) -> None:
    who = Participant({"RLGUARD_RUN_DIR": str(tmp_path), "RLGUARD_ROLE": "rollout", "RANK": "1"})
    procs = _sleepers(3)
    try:
        _announce(who, [p.pid for p in procs], time.time())
        killed = _kill_previous(who)
        assert sorted(killed) == sorted(p.pid for p in procs)
        for p in procs:
            p.wait(10)
            assert not _running(p.pid)
    finally:
        for p in procs:
            p.kill()


def test_a_process_younger_than_the_announcement_is_a_stranger_and_spared(tmp_path: Path) -> None:
    """Its pid was reused after the tree died (a reboot, a long-lived node): not ours to kill."""
    who = Participant({"RLGUARD_RUN_DIR": str(tmp_path), "RANK": "0"})
    procs = _sleepers(3)
    try:
        _announce(who, [p.pid for p in procs], time.time() - 60)
        assert _kill_previous(who) == []
        assert all(_running(p.pid) for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def test_an_unreadable_announcement_kills_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    who = Participant({"RLGUARD_RUN_DIR": str(tmp_path), "RANK": "0"})
    who.announcement.parent.mkdir(parents=True)
    who.announcement.write_text('{"pids": "not a map"')
    assert _kill_previous(who) == []
    assert "unreadable" in caplog.text
    who.announcement.unlink()
    assert _kill_previous(who) == []  # none: a first start


def test_the_host_defaults_its_role_and_job_from_the_run_directory(tmp_path: Path) -> None:
    who = Participant({"RLGUARD_RUN_DIR": str(tmp_path / "job-7")})
    assert (who.role, who.rank, who.job) == ("rollout", 0, "job-7")
    assert who.announcement == tmp_path / "job-7" / "engines" / "rollout-0.json"
