"""The launcher hook's command line is one contract: what the server's action worker builds is
what every hook parses. A renamed option fails here, not on a node."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from recovery.protocol.hook_request import HookRequest, add_request_arguments
from recovery.supervision import hook

REQUEST = HookRequest(
    action="restart_role",
    job="grpo-7",
    idempotency_key="incident-3/action-9",
    node="gpu-node-2",
    role="rollout",
    rank="1",
    away_from="gpu-node-4",
    extra={"checkpoint": "/ckpt/step-40", "b": 1},
    wait=12.5,
)


def test_the_spelling_is_pinned() -> None:
    assert REQUEST.argv("/usr/local/bin/hook") == [
        "/usr/local/bin/hook",
        "restart_role",
        "--job=grpo-7",
        "--node=gpu-node-2",
        "--role=rollout",
        "--rank=1",
        "--away-from=gpu-node-4",
        "--idempotency-key=incident-3/action-9",
        '--extra={"b": 1, "checkpoint": "/ckpt/step-40"}',
        "--wait=12.5",
    ]
    bare = HookRequest(action="restart_job", job="j", idempotency_key="k")
    assert bare.argv("h") == ["h", "restart_job", "--job=j", "--idempotency-key=k"]


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("action")
    add_request_arguments(p)
    p.add_argument("--wait", type=float)
    return p.parse_args(argv)


@pytest.mark.parametrize("value", ["-h", "--run-root=/x", "a b", "=x", "--x"])
def test_every_value_reaches_the_hook_as_a_value(value: str) -> None:
    request = HookRequest(action="restart_role", job="j", idempotency_key=value, role=value)
    args = _parse(request.argv("hook")[1:])
    assert (args.idempotency_key, args.role, args.job) == (value, value, "j")


def test_what_the_server_builds_the_hook_parses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """RLGuard's own hook takes the server's argv: it gets as far as looking for the job's
    launcher (none runs here: exit 2 naming the job), never an argument error."""
    argv = [*REQUEST.argv("hook")[1:], f"--run-root={tmp_path}"]
    code = hook.main(argv, prog="hook", default_run_root=None)
    assert code == 2
    assert "no running job 'grpo-7'" in capsys.readouterr().err
