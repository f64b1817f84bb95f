"""Bad input to the job on vLLM engines is refused naming the bad value, and changes nothing:
the launcher's options, a refit request to the worker extension, an order to the engine
standby, the job's configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from integrations.vllm.worker_extension import parse_source
from workload.engines.engine_host import _rank_of
from workload.job import JobConfig, JobConfigError
from workload.launch import main


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--rollout-engine", "sglang"], "invalid choice: 'sglang'"),
        (["--model", "/nowhere"], "--model: only with --rollout-engine vllm"),
        (
            ["--rollout-engine", "vllm", "--model", "/nowhere"],
            "--model '/nowhere' is not a Hugging Face model directory",
        ),
        (
            ["--rollout-engine", "vllm", "--ray", "--model", "/nowhere"],
            "--model '/nowhere' is not a Hugging Face model directory",
        ),
        (["--transport", "ucx"], "invalid choice: 'ucx'"),
        (["--engine-probation", "30"], "--engine-probation: only with --rollout-engine vllm"),
        (
            ["--rollout-engine", "vllm", "--engine-probation", "soon"],
            "--engine-probation must be seconds >= 0 or 'off', got 'soon'",
        ),
        (
            ["--rollout-engine", "vllm", "--engine-probation", "-1"],
            "--engine-probation must be seconds >= 0 or 'off', got '-1'",
        ),
        (
            ["--rollout-engine", "vllm", "--engine-probation", "nan"],
            "--engine-probation must be seconds >= 0 or 'off', got 'nan'",
        ),
        (
            ["--engine-request-timeout", "30"],
            "--engine-request-timeout: only with --rollout-engine vllm",
        ),
        (
            ["--rollout-engine", "vllm", "--engine-request-timeout", "0"],
            "--engine-request-timeout must be seconds > 0, got 0.0",
        ),
        (
            ["--rollout-engine", "vllm", "--engine-request-timeout", "inf"],
            "--engine-request-timeout must be seconds > 0, got inf",
        ),
        (
            ["--rollout-engine", "vllm", "--engine-request-timeout", "soon"],
            "--engine-request-timeout: invalid float value: 'soon'",
        ),
    ],
)
def test_launcher_options_are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--run-dir", str(tmp_path / "run"), "--steps", "2", *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert not (tmp_path / "run").exists()


def _engine_config(tmp_path: Path, *extra: str) -> JobConfig:
    """The job's configuration from the launcher's options, a vLLM job plus ``extra``."""
    from workload.launch import _checked_config, _supervise_parser

    p = _supervise_parser()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    argv = [
        "--run-dir",
        str(tmp_path / "run"),
        "--steps",
        "2",
        "--rollout-engine",
        "vllm",
        "--model",
        str(model),
        *extra,
    ]
    config, _, _ = _checked_config(p, p.parse_args(argv))
    return config


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 30.0), ("off", None), ("0", 0.0), ("12.5", 12.5)]
)
def test_engine_probation_reaches_the_job_config(
    tmp_path: Path, raw: str | None, expected: float | None
) -> None:
    extra = [] if raw is None else ["--engine-probation", raw]
    assert _engine_config(tmp_path, *extra).engine_probation_s == expected


@pytest.mark.parametrize(("raw", "expected"), [(None, 120.0), ("15", 15.0), ("0.5", 0.5)])
def test_engine_request_timeout_reaches_the_job_config(
    tmp_path: Path, raw: str | None, expected: float
) -> None:
    extra = [] if raw is None else ["--engine-request-timeout", raw]
    assert _engine_config(tmp_path, *extra).engine_request_timeout_s == expected


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "60"])
def test_the_job_config_refuses_a_bad_request_timeout(bad: Any) -> None:
    with pytest.raises(JobConfigError, match=f"engine_request_timeout_s must be > 0, got {bad!r}"):
        JobConfig(job="j", steps=1, engine_request_timeout_s=bad)


GOOD: dict[str, Any] = {
    "registry": "127.0.0.1:5000",
    "version": 3,
    "specs": [["w", "float32", [2, 2]]],
}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"registry": "nowhere"}, "registry must be 'host:port', got 'nowhere'"),
        ({"version": -1}, "version must be an int >= 0, got -1"),
        ({"version": True}, "version must be an int >= 0, got True"),
        ({"transport": "ucx"}, "transport must be tcp or shm, got 'ucx'"),
        ({"specs": []}, "specs must be a non-empty list"),
        (
            {"specs": [["w", "float32"]]},
            "a spec must be [name, dtype, shape], got ['w', 'float32']",
        ),
        ({"weight_set": ""}, "weight_set must be a name, got ''"),
    ],
)
def test_a_bad_refit_request_is_refused_naming_the_field(
    change: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ValueError) as info:
        parse_source({**GOOD, **change})
    assert needle in str(info.value)


def test_a_good_refit_request_parses() -> None:
    registry, weight_set, transport, version, specs = parse_source(GOOD)
    assert (registry, weight_set, transport, version) == ("127.0.0.1:5000", "policy", "tcp", 3)
    assert [(s.name, s.dtype, s.shape) for s in specs] == [("w", "float32", (2, 2))]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--run-dir", "D"], "must name --rank"),
        (["--run-dir", "D", "--rank", "-1"], "--rank must be >= 0"),
    ],
)
def test_an_order_to_the_engine_standby_must_name_its_rank(argv: list[str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        _rank_of(argv)
    assert _rank_of(["--run-dir", "D", "--rank", "1"]) == 1


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"rollout_engine": "vllm"}, "needs model_dir"),
        ({"rollout_engine": "trl"}, "rollout_engine must be"),
        ({"transport": "ucx"}, "transport must be tcp or shm, got 'ucx'"),
    ],
)
def test_the_job_configuration_refuses_bad_engine_settings(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(JobConfigError, match=needle):
        JobConfig(job="j", steps=1, **kw)
