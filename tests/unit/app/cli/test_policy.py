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
        (
            ["replay", str(CORPUS / "ok_healthy_0.jsonl.gz"), "--compress", "0.5"],
            "--compress 0.5 must be a number of at least 1",
        ),
        (
            ["replay", str(CORPUS / "ok_healthy_0.jsonl.gz"), "--compress", "nan"],
            "--compress nan must be a number of at least 1",
        ),
        (
            ["replay", str(CORPUS / "ok_healthy_0.jsonl.gz"), "--speed", "2", "--compress", "2"],
            "--speed and --compress cannot be combined",
        ),
        (
            [
                "replay",
                str(CORPUS / "ok_healthy_0.jsonl.gz"),
                str(CORPUS / "ok_healthy_1.jsonl.gz"),
                "--tail",
                "5",
            ],
            "--speed and --tail apply to a single trace, not a corpus",
        ),
        (
            ["replay", str(CORPUS / "ok_healthy_0.jsonl.gz"), "/no/such/dir"],
            "trace file not found: /no/such/dir",
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


def _copy(names: list[str], to: Path) -> None:
    for name in names:
        for f in (f"{name}.jsonl.gz", f"{name}.labels.json"):
            (to / f).write_bytes((CORPUS / f).read_bytes())


def test_replay_of_a_directory_scores_it_as_a_corpus_and_check_passes(tmp_path: Path) -> None:
    _copy(["fault_nodes_lost_0", "ok_healthy_0", "fault_straggler_trainer_pace_1"], tmp_path)
    r = CliRunner().invoke(cli, ["replay", str(tmp_path), "--check"])
    assert r.exit_code == 0, r.output
    assert "ok   fault_nodes_lost_0.jsonl.gz: expected 1, found 1, opened 1" in r.output
    assert "corpus: 3 traces, expected 2, found 2, opened 2: precision 1.000" in r.output
    assert r.output.rstrip().endswith("corpus: PASS")
    r = CliRunner().invoke(cli, ["replay", str(tmp_path), "--compress", "5", "--check"])
    assert r.exit_code == 0, r.output
    assert "corpus (time-compressed 5x): 3 traces" in r.output


def test_check_fails_a_corpus_whose_labels_are_not_met(tmp_path: Path) -> None:
    _copy(["fault_nodes_lost_0", "ok_healthy_0"], tmp_path)
    # Labels that say the healthy trace holds a fault: a miss, so recall 0.5 and FAIL.
    labels = tmp_path / "ok_healthy_0.labels.json"
    labels.write_text(
        labels.read_text().replace(
            '"expect": []',
            '"expect": [{"kind": "node_silent", "start": 1700000010.0, "window": 75, '
            '"subject": {"node": "n1"}}]',
        )
    )
    r = CliRunner().invoke(cli, ["replay", str(tmp_path), "--check"])
    assert r.exit_code == 1, r.output
    assert "FAIL ok_healthy_0.jsonl.gz: expected 1, found 0" in r.output
    assert "missed: ok_healthy_0:node_silent" in r.output
    assert r.output.rstrip().endswith("corpus: FAIL")
    # Without --check the same corpus is reported, and the command succeeds.
    assert CliRunner().invoke(cli, ["replay", str(tmp_path)]).exit_code == 0


def test_check_of_one_trace_fails_when_it_has_no_labels(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl.gz").write_bytes((CORPUS / "ok_healthy_0.jsonl.gz").read_bytes())
    r = CliRunner().invoke(cli, ["replay", str(tmp_path / "t.jsonl.gz"), "--check"])
    assert r.exit_code == 1 and "has no labels file beside it" in r.output
