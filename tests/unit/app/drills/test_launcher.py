"""The node worker's side of a drill: the hook's command line (every value joined to its
option, the drill's own key, the fault in --extra) and the reading of the launcher's answer."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from app.drills.launcher import HookSetup, _answer, hook_argv
from app.models.drill import Drill


def _row(**kw: object) -> Drill:
    base: dict[str, object] = dict(
        id=7,
        job="j",
        role="trainer",
        rank=0,
        node="n1",
        fault="kill",
        requested_by="user:op",
        requested_at=datetime.now(UTC),
    )
    base.update(kw)
    return Drill(**base)


def test_the_hook_gets_one_argv_element_per_value_and_the_drill_key() -> None:
    row = _row(at_step=12, role="-h")
    argv = hook_argv(HookSetup("/hook", 5.0), row)
    assert argv[:2] == ["/hook", "inject_fault"]
    assert "--role=-h" in argv and "--rank=0" in argv and "--node=n1" in argv
    assert "--idempotency-key=drill-7" in argv and "--wait=5" in argv
    [extra] = [a for a in argv if a.startswith("--extra=")]
    assert json.loads(extra.split("=", 1)[1]) == {
        "fault": "kill",
        "drill": "drill-7",
        "at_step": 12,
        "dry_run": False,
        # When the worker gives up on a drill armed for its step: the launcher refuses it after.
        "expires_at": round(row.requested_at.timestamp() + 1800, 3),
    }


def test_a_plan_is_a_dry_run() -> None:
    [extra] = [
        a for a in hook_argv(HookSetup("/hook"), _row(plan=True)) if a.startswith("--extra=")
    ]
    assert json.loads(extra.split("=", 1)[1])["dry_run"] is True


def test_the_answer_is_the_last_json_line_or_nothing() -> None:
    assert _answer('noise\n{"ok": true, "what": "SIGKILL"}\n') == {"ok": True, "what": "SIGKILL"}
    assert _answer("") == {} and _answer("not json") == {} and _answer("[1]") == {}
