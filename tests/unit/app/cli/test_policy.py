from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli

pytestmark = pytest.mark.timeout(60)


CORPUS = Path(__file__).resolve().parents[3] / "policy_traces"


def test_replay_prints_incidents_tiers_and_delays() -> None:
    r = CliRunner().invoke(cli, ["replay", str(CORPUS / "fault_nodes_lost_0.jsonl.gz")])
    assert r.exit_code == 0, r.output
    assert "open     heavy  nodes_lost:job=grpo-a detected after 75.000s" in r.output
    assert "restore_checkpoint*" in r.output  # * = waits for approval
    assert "precision 1.000 recall 1.000" in r.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["replay", "/no/such/trace.jsonl"], "trace file not found: /no/such/trace.jsonl"),
        (
            ["replay", str(CORPUS / "ok_healthy_0.jsonl.gz"), "--speed", "0"],
            "--speed 0.0 must be a positive number",
        ),
        (
            ["replay", str(CORPUS / "ok_healthy_0.jsonl.gz"), "--tail", "-1"],
            "--tail -1.0 must not be negative",
        ),
        (
            ["replay", str(CORPUS / "ok_healthy_0.jsonl.gz"), "--policy", "/nope.yaml"],
            "cannot read policy file /nope.yaml",
        ),
        (["worker", "--node", "bad/name"], "bad node name 'bad/name'"),
        (["worker", "--concurrency", "0"], "--concurrency 0 must be at least 1"),
    ],
)
def test_bad_values_are_named(args: list[str], needle: str) -> None:
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2
    assert needle in r.output


def test_bad_trace_line_is_named(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"node": "n0", "sent_at": 1, "samples": []}\n{oops\n')
    r = CliRunner().invoke(cli, ["replay", str(trace)])
    assert r.exit_code == 2 and f"{trace}:2: not JSON" in r.output
