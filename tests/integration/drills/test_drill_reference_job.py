"""``rlguard drill`` on the real reference job (``workload``, under its own launcher as the
launcher hook, watched by the embedded ``rlguard up`` — server, policy engine, Celery worker —
and a node agent), through the real CLI and REST API.

One stack for the module (a stack costs a minute on a loaded machine); the tests run in file
order and each leaves the job training: refusals first (each one line, nothing injected), then
one drill per fault the reference job's launcher supports, each with its report checked (numbers
present and sane, marked as a drill, not counted in the job's ETTR), disk-full last (it is heavy:
SAFE_MODE, which then refuses the next drill).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from sqlmodel import Session, select

from app.cli.demo import DemoStack
from app.drills.figures import generations_text
from recovery.report import HeartbeatReporter, heartbeat_path, read_heartbeat
from tests.harness import free_port, rlguard_env, run_cli, wait_for
from workload.job import RunDir, read_events

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
JOB = "ref-drill"


def _short(data: dict[str, Any]) -> None:
    data["incidents"]["quiet_period_seconds"] = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    s = DemoStack(
        tmp_path_factory.mktemp("drill"),
        free_port(),
        job=JOB,
        steps=100_000,
        decode_ms=10.0,
        schedule=None,
        policy_edit=_short,
    )
    try:
        s.start_server()
        s.start_agent()
        s.start_job()
        run = RunDir(s.run_dir)
        wait_for(lambda: _step(run) >= 3, 240, "the job's step 3", context=lambda: _logs(s))
        yield s
    finally:
        s.stop()


def _step(run: RunDir) -> int:
    return max((e["step"] for e in read_events(run) if e["kind"] == "step"), default=-1)


def _logs(stack: DemoStack) -> str:
    out = [
        f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}"
        for f in sorted((stack.workdir / "logs").glob("*.log"))
    ]
    out += [
        f"--- run {f.name}\n{f.read_text(errors='replace')[-1000:]}"
        for f in sorted((stack.run_dir / "logs").glob("*.log"))
    ]
    return "\n".join(out)


def _cli(stack: DemoStack, *args: str, token: str | None = None, timeout: float = 400) -> Any:
    env = rlguard_env(
        None, stack.workdir / "data", RLGUARD_URL=stack.url, RLGUARD_TOKEN=token or stack.token
    )
    return run_cli("drill", *args, env=env, timeout=timeout)


def _injected(stack: DemoStack) -> list[dict[str, Any]]:
    """The launcher's own record of what it injected (its timeline, events.jsonl)."""
    return [e for e in read_events(RunDir(stack.run_dir)) if e["kind"] == "drill_injected"]


def _viewer_token(stack: DemoStack) -> str:
    from app.auth.users import create_user
    from app.core.db import make_engine
    from app.models import Role, User

    engine = make_engine(f"sqlite:///{stack.workdir / 'data' / 'rlguard.db'}")
    try:
        with Session(engine) as s:
            name = f"viewer{secrets.randbelow(10_000)}"
            assert s.exec(select(User).where(User.name == name)).first() is None
            token = create_user(
                s, name=name, role=Role.viewer, actor="test", password=secrets.token_urlsafe(12)
            )[1]
            s.commit()
            return token
    finally:
        engine.dispose()


def _drill(stack: DemoStack, drill_id: int) -> dict[str, Any]:
    r = stack.api("GET", f"/api/v1/drills/{drill_id}")
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


def _quiet(stack: DemoStack, role: str, rank: str) -> None:
    """Wait until no incident of that process is open (the previous drill's resolves after the
    quiet period): a drill of a process with an open incident is refused."""

    def quiet() -> bool:
        return not any(
            i["status"] == "open"
            and i["subject"].get("role") == role
            and str(i["subject"].get("rank")) == rank
            for i in stack.incidents()
        )

    wait_for(quiet, 120, f"{role}-{rank}'s incidents to resolve", context=lambda: _logs(stack))


def test_bad_inputs_are_one_clear_line_each_and_nothing_is_injected(stack: DemoStack) -> None:
    cases = [
        (
            ["--job", "no-such-job", "--fault", "kill", "--role", "trainer"],
            "no job named 'no-such-job'",
        ),
        (
            ["--job", JOB, "--fault", "melt", "--role", "trainer"],
            "--fault 'melt' is not one of kill, hang, oom, disk-full",
        ),
        (
            ["--job", JOB, "--fault", "kill", "--role", "critic"],
            f"job '{JOB}' has no role 'critic' (its roles: rollout, trainer)",
        ),
        (
            ["--job", JOB, "--fault", "kill", "--role", "rollout", "--rank", "9"],
            f"job '{JOB}' has no rollout rank 9 (ranks: 0, 1)",
        ),
        (
            ["--job", JOB, "--fault", "kill", "--role", "trainer", "--at-step", "soon"],
            "--at-step must be a whole number >= 0, got 'soon'",
        ),
        # The launcher's own refusal: the reference job's rollouts have no OOM point.
        (
            ["--job", JOB, "--fault", "oom", "--role", "rollout"],
            "the launcher refused: the reference job's rollout has no oom injection point",
        ),
    ]
    for args, needle in cases:
        r = _cli(stack, *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, (args, r.returncode, r.stderr, r.stdout)
        assert lines[0].startswith("rlguard: error: ") and needle in lines[0], (args, lines)
    viewer = _cli(
        stack, "--job", JOB, "--fault", "kill", "--role", "trainer", token=_viewer_token(stack)
    )
    assert viewer.returncode == 1, viewer.stderr
    [line] = viewer.stderr.strip().splitlines()
    assert line.startswith("rlguard: error: this needs the operator role; ") and line.endswith(
        " is viewer"
    ), line
    assert _injected(stack) == []


def _participant_phase(stack: DemoStack, role: str) -> str | None:
    r = stack.api("GET", f"/api/v1/jobs/{JOB}")
    for p in r.json()["participant_list"] if r.status_code == 200 else []:
        if p["role"] == role:
            return str(p["phase"])
    return None


def test_a_role_no_launcher_runs_is_refused_by_the_launcher(stack: DemoStack) -> None:
    # A process of the job that reports (its heartbeat, read by the agent) but is not under the
    # launcher: the server knows the role, the launcher refuses it. Its heartbeat is kept fresh
    # until it says DONE (a silent one would be a real heartbeat_lost, healed by nobody).
    beat = HeartbeatReporter(stack.run_dir, "evaluator", 0, job=JOB, pid=os.getpid())
    stop = threading.Event()

    def keep_fresh() -> None:
        while not stop.wait(0.3):
            beat.update(phase="EVAL", step=1, force=True)

    beat.update(phase="EVAL", step=1, force=True)
    pacer = threading.Thread(target=keep_fresh)
    pacer.start()
    try:
        wait_for(
            lambda: _participant_phase(stack, "evaluator") == "EVAL",
            60,
            "the agent to report evaluator-0",
        )
        r = _cli(stack, "--job", JOB, "--fault", "kill", "--role", "evaluator")
        assert r.returncode == 2, r.stderr  # the launcher's refusal: a 422, as a bad value
        [line] = r.stderr.strip().splitlines()
        assert (
            line.startswith("rlguard: error: drill ")
            and ("the launcher refused: this launcher runs no process evaluator-0") in line
        ), line
    finally:
        stop.set()
        pacer.join(5)
        beat.update(phase="DONE", force=True)
    wait_for(lambda: _participant_phase(stack, "evaluator") == "DONE", 60, "evaluator-0 DONE")
    assert _injected(stack) == []
    assert [i for i in stack.incidents() if i["subject"].get("role") == "evaluator"] == []


def test_plan_says_what_would_happen_and_injects_nothing(stack: DemoStack) -> None:
    r = _cli(stack, "--job", JOB, "--fault", "kill", "--role", "rollout", "--rank", "1", "--plan")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert (
        out[0].startswith("plan (drill ") and "nothing injected): SIGKILL rollout-1 (pid " in out[0]
    )
    assert out[1].startswith("then RLGuard, with the shipped policy: its launcher reports the exit")
    assert _injected(stack) == []
    # Listed only on request: a plan is not a drill that ran.
    listed = stack.api("GET", "/api/v1/drills").json()
    assert all(not d["plan"] for d in listed)
    plans = stack.api("GET", "/api/v1/drills", params={"plans": True}).json()
    assert plans[0]["status"] == "planned" and plans[0]["injected_at"] is None


def _check_report(
    stack: DemoStack, d: dict[str, Any], *, fault: str, target: str
) -> dict[str, Any]:
    assert d["status"] == "recovered", json.dumps(d, indent=1)
    rep = d["report"]
    assert d["fault"] == fault and f"{d['role']}-{d['rank']}" == target
    assert rep["incident"] is not None and rep["incident"]["id"] in d["incident_ids"]
    assert 0 <= rep["detection_delay_seconds"] < 120, rep
    assert rep["time_to_first_new_step_seconds"] >= rep["detection_delay_seconds"], rep
    assert rep["time_to_first_new_step_seconds"] < 300, rep
    assert rep["steps_redone"] >= 0 and rep["seconds_lost"] >= 0, rep
    cf = rep["whole_job_restart"]
    # The ledger's counterfactual includes a person's 30 minutes to notice: far above ours.
    assert cf["seconds_lost"] > rep["seconds_lost"] and cf["steps_redone"] >= 0, rep
    assert rep["counted_in_ettr"] is False
    # Marked on the incident's timeline, and the ledger leaves it out of the ETTR.
    inc = stack.incident(rep["incident"]["id"])
    marks = [e for e in inc["timeline"] if e["type"] == "drill"]
    assert marks and marks[0]["detail"]["drill"] == d["id"], inc["timeline"]
    ledger = stack.api("GET", f"/api/v1/jobs/{JOB}/goodput", params={"since": "1h"}).json()
    rows = {r["id"]: r for r in ledger["incidents"]}
    for i in d["incident_ids"]:
        assert rows[i]["drill"] is True and rows[i]["counted_seconds"] == 0.0, rows[i]
    if all(r["drill"] for r in ledger["incidents"]):
        assert ledger["ettr"] == 1.0 and ledger["lost_seconds"] == 0.0, ledger
    # Audited, by the operator who asked.
    return rep


@pytest.mark.parametrize(
    ("fault", "role", "rank"),
    [
        ("kill", "rollout", "1"),
        ("hang", "rollout", "0"),
        ("kill", "trainer", "0"),
        ("oom", "trainer", "0"),
    ],
)
def test_a_drill_is_injected_followed_and_reported(
    stack: DemoStack, fault: str, role: str, rank: str
) -> None:
    _quiet(stack, role, rank)
    before = len(_injected(stack))
    r = _cli(
        stack, "--job", JOB, "--fault", fault, "--role", role, "--rank", rank, "--timeout", "300"
    )
    assert r.returncode == 0, (r.stderr, r.stdout, _logs(stack))
    assert len(_injected(stack)) == before + 1
    print(r.stdout)  # the printed report, for whoever runs this with -s
    drill_id = int(r.stdout.split(":")[0].split()[1])
    d = _drill(stack, drill_id)
    rep = _check_report(stack, d, fault=fault, target=f"{role}-{rank}")
    assert f"drill {drill_id}: {fault} {role}-{rank} of job {JOB}" in r.stdout
    assert "detection delay" in r.stdout and "whole-job restart" in r.stdout
    if fault in ("kill", "hang"):
        assert [a["action"] for a in rep["actions"]][-1] == "restart_role", rep
        assert rep["actions"][-1]["status"] == "succeeded", rep
    # Generations redone, counted on the node from the rollout WAL's lost_rollout events.
    assert rep["unit"] == "rollouts" and "generations redone  " in r.stdout, rep
    if role == "trainer":  # the rollouts' WAL kept every finished batch: none generated again
        assert rep["generations_redone"] == 0, rep
    else:
        low, high = _lost_rollouts(stack, d)
        assert low <= rep["generations_redone"] <= high, (rep, low, high)
    assert f"generations redone  {generations_text(rep)}" in r.stdout


def _lost_rollouts(stack: DemoStack, d: dict[str, Any]) -> tuple[int, int]:
    """The rollouts lost mid-batch (so generated again) after the injection, by the run's own
    events: up to the drill's end (counted before it), and up to now (the count may be later)."""
    injected = datetime.fromisoformat(d["injected_at"]).timestamp()
    finished = datetime.fromisoformat(d["finished_at"]).timestamp()
    lost = [
        e
        for e in read_events(RunDir(stack.run_dir))
        if e["kind"] == "lost_rollout" and e["ts"] >= injected
    ]
    return (sum(e["samples"] for e in lost if e["ts"] <= finished), sum(e["samples"] for e in lost))


def test_a_drill_armed_for_a_step_is_injected_at_that_step(stack: DemoStack) -> None:
    # The launcher holds the request until the rollout reports the step; meanwhile the node's
    # worker asks again with the same key (its task re-scheduled, the worker never held).
    _quiet(stack, "rollout", "1")

    # The rollout's own step (what its launcher watches), not the trainer's, far enough ahead
    # that the request reaches the launcher before it: ~30 s of the job's own pace (the CLI's
    # start and the worker's delivery took longer than 4 steps in a CI run under load, and the
    # step was reached before the request came: injected at once, never armed).
    def rollout_step() -> int:
        beat = read_heartbeat(heartbeat_path(stack.run_dir, "rollout", 1)) or {}
        return int(beat.get("step") or 0)

    t0, s0 = time.monotonic(), rollout_step()
    time.sleep(5.0)
    s1 = rollout_step()
    at = s1 + max(4, math.ceil((s1 - s0) / (time.monotonic() - t0) * 30.0))
    r = _cli(
        stack,
        "--job",
        JOB,
        "--fault",
        "kill",
        "--role",
        "rollout",
        "--rank",
        "1",
        "--at-step",
        str(at),
        "--timeout",
        "300",
    )
    assert r.returncode == 0, (r.stderr, r.stdout, _logs(stack))
    print(r.stdout)
    d = _drill(stack, int(r.stdout.split(":")[0].split()[1]))
    assert d["at_step"] == at and d["step_at_injection"] >= at, d
    armed = [e for e in read_events(RunDir(stack.run_dir)) if e["kind"] == "drill_armed"]
    assert armed and armed[-1]["at_step"] == at
    _check_report(stack, d, fault="kill", target="rollout-1")


def test_another_drill_on_the_job_is_refused_while_one_runs(stack: DemoStack) -> None:
    _quiet(stack, "rollout", "1")
    before = len(_injected(stack))
    first = stack.api(
        "POST", "/api/v1/drills", json={"job": JOB, "fault": "kill", "role": "rollout", "rank": 1}
    )
    assert first.status_code == 201, first.text
    # Asked through the API at once: the first drill is still running for at least its
    # injection, detection, restart and the job's first new step (seconds), while the CLI's own
    # start-up could take longer than that on a loaded machine (CI saw the first recovered
    # before the CLI asked). The CLI's one-line 409 is checked by the SAFE_MODE test below.
    second = stack.api(
        "POST", "/api/v1/drills", json={"job": JOB, "fault": "hang", "role": "rollout", "rank": 0}
    )
    assert second.status_code == 409, second.text
    assert f"drill {first.json()['id']} is still running on job '{JOB}'" in second.text
    wait_for(
        lambda: _drill(stack, first.json()["id"])["status"] in ("recovered", "unrecovered"),
        300,
        "the first drill to end",
        context=lambda: _logs(stack),
    )
    # Only the first was injected.
    assert [e["drill"] for e in _injected(stack)[before:]] == [f"drill-{first.json()['id']}"]


def test_drills_are_audited_and_listed(stack: DemoStack) -> None:
    from app.core.db import make_engine
    from app.models import AuditEvent

    engine = make_engine(f"sqlite:///{stack.workdir / 'data' / 'rlguard.db'}")
    try:
        with Session(engine) as s:
            rows = s.exec(select(AuditEvent).where(AuditEvent.action == "drill.request")).all()
    finally:
        engine.dispose()
    assert len(rows) >= 5 and all(r.actor == f"user:{stack.user}" for r in rows)
    assert {r.detail["fault"] for r in rows} >= {"kill", "hang", "oom"}
    listed = _cli(stack, "--report", "--job", JOB)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count(f"of job {JOB}") == len(stack.api("GET", "/api/v1/drills").json())


@pytest.mark.e2e  # drives Chromium
def test_the_drills_page_from_the_job_page_shows_the_drills_and_their_figures(
    stack: DemoStack,
) -> None:
    from playwright.sync_api import expect

    from tests.harness.chromium import chromium, sign_in_as

    drills = stack.api("GET", "/api/v1/drills", params={"job": JOB}).json()
    done = [d for d in drills if d["status"] == "recovered"]
    assert done, drills
    with chromium() as browser:
        ctx = browser.new_context(viewport={"width": 1440, "height": 900})
        page = ctx.new_page()
        page.set_default_timeout(15_000)
        sign_in_as(page, stack.url, stack.user, stack.password)
        page.goto(f"{stack.url}/jobs/{JOB}")
        with page.expect_navigation():
            page.click("[data-testid=job-drills]")
        assert page.url.endswith(f"/drills?job={JOB}")
        expect(page.locator("h1")).to_have_text(f"Drills of {JOB}")
        assert page.locator("[data-testid=drills-table] tbody tr").count() == len(drills)
        row = page.locator(f"[data-testid=drill-{done[0]['id']}]")
        expect(row.locator("[data-testid=status]")).to_have_text("recovered")
        rep = done[0]["report"]
        gens = row.locator("[data-figure='generations redone']").inner_text()
        assert gens == generations_text(rep), gens
        lost = row.locator("[data-figure='seconds lost']").inner_text()
        assert lost == f"{rep['seconds_lost']:.1f} s", lost
        incident = row.locator("[data-figure=incident] a")
        assert incident.get_attribute("href") == f"/incidents/{rep['incident']['id']}"
        ctx.close()


def test_disk_full_is_heavy_safe_mode_then_refuses_the_next_drill(stack: DemoStack) -> None:
    _quiet(stack, "trainer", "0")
    r = _cli(stack, "--job", JOB, "--fault", "disk-full", "--role", "trainer", "--no-wait")
    assert r.returncode == 0, r.stderr
    drill_id = int(r.stdout.split(":")[0].split()[1])

    def heavy() -> dict[str, Any] | None:
        d = _drill(stack, drill_id)
        inc = (d["report"] or {}).get("incident")
        return d if inc and inc["kind"] == "storage_unwritable" else None

    d = wait_for(heavy, 180, "storage_unwritable", context=lambda: _logs(stack))
    assert d["status"] == "injected" and d["report"]["incident"]["tier"] == "heavy", d
    assert d["report"]["recovered"] is False

    def refused_for_safe_mode() -> Any:
        # Until SAFE_MODE is set the refusal names the drill still in flight: either way one
        # line, nothing injected.
        r = _cli(stack, "--job", JOB, "--fault", "kill", "--role", "rollout")
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        return r if "SAFE_MODE" in r.stderr else None

    before = len(_injected(stack))
    refused = wait_for(refused_for_safe_mode, 120, "SAFE_MODE", context=lambda: _logs(stack))
    assert f"job '{JOB}' is in SAFE_MODE (incident " in refused.stderr, refused.stderr
    assert len(_injected(stack)) == before
    state = _drill(stack, drill_id)["report"]["state"]
    assert "approver" in state or "SAFE_MODE" in state, state
