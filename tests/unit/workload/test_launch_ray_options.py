"""python -m workload.launch: options that cannot go together (--ray, --backend) end in one line,
exit 2, and start nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from workload.launch import main


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--ray", "--on-failure", "restart-job"], "--ray restarts through Ray"),
        (["--ray", "--standby"], "--ray restarts through Ray"),
        (["--ray-address", "127.0.0.1:6379"], "--ray-address: only with --ray"),
        (["--ray-restart-by", "rlguard"], "--ray-restart-by: only with --ray"),
        (["--ray", "--ray-restart-by", "nobody"], "invalid choice: 'nobody'"),
        (["--ray", "--backend", "slurm"], "--backend: --ray starts and restarts its processes"),
        (["--backend", "pbs"], "--backend: unknown backend 'pbs' (known: local, slurm)"),
        # Outside a Slurm batch job the slurm backend refuses, naming why.
        (["--backend", "slurm"], "--backend: "),
    ],
)
def test_options_that_do_not_go_with_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--run-dir", str(tmp_path / "run"), "--steps", "2", *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert not (tmp_path / "run").exists()


def test_resume_disable_refuses_a_run_directory_that_holds_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.json").write_text("{}")  # what every launch writes first
    for resume in (["--resume", "disable"], ["--resume=disable"]):
        with pytest.raises(SystemExit) as info:
            main(["--run-dir", str(run), "--steps", "2", "--ray", *resume])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "--resume disable" in err and "--resume auto" in err and str(run) in err, err
    assert sorted(p.name for p in run.iterdir()) == ["job.json"]  # nothing started
    with pytest.raises(SystemExit) as info:
        main(["--run-dir", str(run), "--steps", "2", "--resume", "scratch"])
    assert info.value.code == 2 and "invalid choice: 'scratch'" in capsys.readouterr().err
