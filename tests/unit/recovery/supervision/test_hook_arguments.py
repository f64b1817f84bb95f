"""The launcher hook's command line in the form the server's action worker passes it: every
value joined to its option (``--job=VALUE``), so an option-looking value stays a value and is
then judged by the hook's own rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.supervision import hook

pytestmark = pytest.mark.timeout(60)


def test_the_joined_form_reaches_the_request_and_option_looking_values_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--idempotency-key=k1", f"--run-root={tmp_path}", "--wait=1"]
    # No launcher runs for the job: the hook got that far, so it parsed the joined form.
    assert hook.main(["restart_role", "--job=j", "--role=trainer", "--rank=0", *base],
                     prog="hook", default_run_root=None) == 2  # fmt: skip
    assert "no running job 'j'" in capsys.readouterr().err
    for argv, named in [
        (["--job=-h"], "--job '-h' cannot name a run directory"),
        (["--job=--run-root=/tmp/x"], "--job '--run-root=/tmp/x' cannot name a run directory"),
        (["--job=j", "--role=-h"], "--role '-h' must be"),
        (["--job=jobC;id"], "--job 'jobC;id' cannot name a run directory"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            hook.main(["restart_role", *argv, *base], prog="hook", default_run_root=None)
        assert exit_.value.code == 2
        assert named in capsys.readouterr().err
