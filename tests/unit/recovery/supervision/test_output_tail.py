"""The output tail: bounded whatever the log holds, only the current start's output, redacted;
the kernel's OOM-kill record from cgroup v2's memory.events."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from recovery.redaction import environment_secrets, redact_text
from recovery.supervision.kernel_oom import memory_events_path, oom_kill_line, oom_kills
from recovery.supervision.output_tail import MAX_LINE_CHARS, OutputTail


def test_only_the_current_starts_output_counts(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory (previous start)\n")
    tail = OutputTail(log)
    tail.mark()
    assert tail.lines() == []
    with log.open("a") as f:
        f.write("step 1\n\x1b[31mERROR\x1b[0m boom\r\n")
    assert tail.lines() == ["step 1", "ERROR boom"]


def test_reading_the_tail_of_100_mb_allocates_about_the_window(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    line = b"INFO step metrics: loss=0.4213 reward=0.118 kl=0.0021 lr=1e-06 tokens=65536\n"
    with log.open("wb") as f:
        for _ in range(100):
            f.write(line * (1024 * 1024 // len(line) + 1))
        f.write(b"x" * 10_000 + b"\nFATAL last line\n")
    assert log.stat().st_size > 100 * 1024 * 1024
    tail = OutputTail(log, max_bytes=64 * 1024, max_lines=200)
    tracemalloc.start()
    lines = tail.lines()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert lines[-1] == "FATAL last line" and len(lines) <= 200
    assert peak < 1024 * 1024, peak  # a 64 KiB window, never the 100 MB file
    assert all(len(x) <= MAX_LINE_CHARS for x in lines)


def test_a_partial_first_line_is_dropped_and_long_lines_are_cut(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_bytes(b"A" * 5000 + b"\n" + b"B" * 5000 + b"\nlast\n")
    lines = OutputTail(log, max_bytes=6000).lines()
    assert lines == ["B" * MAX_LINE_CHARS, "last"]


def test_secrets_of_the_childs_environment_and_url_credentials_are_redacted(tmp_path: Path) -> None:
    env = {
        "HF_TOKEN": "hf_abcdefghijklmnop",
        "WANDB_API_KEY": "0123456789abcdef",
        "PATH": "/usr/bin",
        "SHORT_TOKEN": "abc",
        "RANK": "0",
    }
    secrets = environment_secrets(env)
    assert set(secrets) == {"hf_abcdefghijklmnop", "0123456789abcdef"}
    text = (
        "push to https://user:s3cretpass@hub.example/x failed with hf_abcdefghijklmnop; "
        "wandb 0123456789abcdef; PATH /usr/bin"
    )
    out = redact_text(text, secrets)
    assert "s3cretpass" not in out and "hf_abcdefghijklmnop" not in out
    assert "0123456789abcdef" not in out and "https://***@hub.example/x" in out
    assert "/usr/bin" in out
    log = tmp_path / "t.log"
    log.write_text(text + "\n")
    assert OutputTail(log).lines(secrets) == [out]


def test_an_oom_kill_record_needs_the_counter_to_rise(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert oom_kills(events) == 1
    assert oom_kill_line(1, 1, events) is None
    assert oom_kill_line(None, 2, events) is None
    line = oom_kill_line(1, 2, events)
    assert line is not None and line.startswith("oom-kill: ") and "oom_kill 1 -> 2" in line
    assert oom_kills(tmp_path / "missing") is None and oom_kills(None) is None


def test_the_cgroup_v2_path_is_found_from_proc_self_cgroup(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/no/such/group/for/this/test\n")
    assert memory_events_path(cgroup) is None  # no such file: no record, never a guess
    cgroup.write_text("12:memory:/v1/only\n")
    assert memory_events_path(cgroup) is None
