"""``rlguard agent`` GPU-source and engine options: a bad value ends the program with one line
naming it (exit 2) before anything is started or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.__main__ import main


@pytest.mark.parametrize(
    ("option", "named"),
    [
        (["--engine", "foo=http://127.0.0.1:8000"], "unknown engine 'foo'"),
        (["--engine", "vllm=notaurl"], "'notaurl'"),
        (["--engine", "vllm=http://127.0.0.1:8000,rank=x"], "'x'"),
        (
            ["--engine", "vllm=http://a:1", "--engine", "sglang=http://b:2"],
            "two engines for rollout rank 0",
        ),
        (["--gpu-source", "dcgm"], "'dcgm'"),
        (["--dcgm-url", "http://127.0.0.1:9400/metrics"], "only with --gpu-source dcgm-exporter"),
        (["--gpu-source", "dcgm-exporter", "--dcgm-url", "ftp://x"], "'ftp://x'"),
        (["--gpu-source", "dcgm-exporter", "--simulate-gpus", "2"], "--simulate-gpus"),
        (["--slurm-node", "gpu 7"], "'gpu 7'"),
    ],
)
def test_bad_source_and_engine_options_exit_2_naming_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], named: str
) -> None:
    spool = tmp_path / "spool"
    argv = ["--server", "http://127.0.0.1:9", "--token", "t", "--node", "n1"]
    argv += ["--run-dir", str(tmp_path), "--spool-dir", str(spool), *option]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1, err
    assert not spool.exists()  # nothing was started or written
