"""``python -m agents``: help, one-line errors naming the bad value, --status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.__main__ import main


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agents", *args], capture_output=True, text=True, timeout=60
    )


def test_help_lists_the_interface() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    for option in (
        "--server",
        "--token",
        "--node",
        "--run-dir",
        "--interval",
        "--simulate-gpus",
        "--spool-dir",
        "--spool-max-bytes",
        "--record",
        "--status",
    ):
        assert option in out.stdout


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--interval", "0"], "'0'"),
        (["--interval", "fast"], "'fast'"),
        (["--simulate-gpus", "-1"], "'-1'"),
        (["--simulate-gpus", "two"], "'two'"),
        (["--spool-max-bytes", "12 parsecs"], "'12 parsecs'"),
        (["--spool-max-bytes", "10"], "'10'"),
        (["--server", "ftp://x"], "'ftp://x'"),
        (["--node", "-bad node"], "'-bad node'"),
        (["--run-dir", "/definitely/not/here"], "'/definitely/not/here'"),
        (["--token", "has space"], "--token"),
        (["--fingerprint-packages", "torch,b@d"], "'b@d'"),
    ],
)
def test_bad_values_give_one_line_naming_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    args = {
        "--server": "http://127.0.0.1:9",
        "--token": "tok",
        "--node": "n1",
        "--run-dir": str(tmp_path),
        "--spool-dir": str(tmp_path / "spool"),
    }
    for key, value in zip(extra[::2], extra[1::2], strict=True):
        args[key] = value
    argv = [x for kv in args.items() for x in kv]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "spool").exists()  # nothing was started or created


def test_missing_required_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--node", "n1", "--run-dir", str(tmp_path), "--token", "t"])
    assert "--server" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--node", "n1", "--server", "http://x:1", "--run-dir", str(tmp_path)])
    assert "--token" in capsys.readouterr().err


def test_token_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(
            [
                "--node",
                "n1",
                "--server",
                "http://x:1",
                "--run-dir",
                str(tmp_path),
                "--token-file",
                str(tmp_path / "nope"),
            ]
        )
    assert "nope" in capsys.readouterr().err


def test_status_without_an_agent(tmp_path: Path) -> None:
    out = run_cli("--node", "n1", "--spool-dir", str(tmp_path), "--status")
    assert out.returncode == 1 and "no agent status" in out.stderr


def test_status_prints_what_the_agent_wrote(tmp_path: Path) -> None:
    status = {
        "agent_id": "n1-abc",
        "node": "n1",
        "pid": 999999999,
        "server": "http://s",
        "updated_at": 1.0,
        "last_send_ok": None,
        "last_error": "unreachable: ConnectError",
        "spool_batches": 4,
        "spool_bytes": 1000,
        "spool_samples": 77,
        "spool_max_bytes": 2000,
        "dropped": {"spool_full": 5, "rejected": 0},
        "produced_samples": 82,
        "acked_samples": 0,
        "nvml_available": False,
        "nvml_unavailable_reason": "NVMLError_LibraryNotFound",
        "gpus": 0,
    }
    (tmp_path / "status.json").write_text(json.dumps(status))
    out = run_cli("--node", "n1", "--spool-dir", str(tmp_path), "--status")
    assert out.returncode == 0
    assert "not running" in out.stdout and "last send: never" in out.stdout
    assert "4 batch(es)" in out.stdout and "spool_full=5" in out.stdout
    as_json = json.loads(
        run_cli("--node", "n1", "--spool-dir", str(tmp_path), "--status", "--json").stdout
    )
    assert as_json["dropped"]["spool_full"] == 5 and as_json["running"] is False
