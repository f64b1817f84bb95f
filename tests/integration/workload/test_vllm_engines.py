"""The reference job on real vLLM engines (``--rollout-engine vllm``), healed by the real stack.

One clean run and runs in which the Worker process of one engine is killed with SIGKILL in
the middle of its requests, watched by embedded ``rlguard up`` (server, policy engine, Celery
worker) and a node agent, with the launcher as the launcher hook. The faulty run must:

* quarantine the engine at once and retry its in-flight requests on the other engine from the
  WAL (no request finished twice, none lost), and keep training on the other engine;
* be healed by RLGuard's ``restart_role``: the warm standby engine is woken, refit to the
  trainer's current weight version through ``recovery.transfer`` and re-admitted only at that
  version, the stages in the action's result on the incident;
* end with the same parameters as the clean run, bit for bit (per-request seeds).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from app.cli.demo import DemoStack
from recovery.wal import WALStatus, WriteAheadLog
from tests.harness import free_port, wait_for
from tests.harness.chromium import chromium, sign_in_as
from tests.harness.vllm_engines import kill_job_engines, tiny_model_dir
from tests.integration.workload._jobs import Job
from workload.chaos import Fault, inject
from workload.engines import records
from workload.job import RunDir, read_events, read_json

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(1200),
]

STEPS = 30
JOB_ARGS = ("--rollout-engine", "vllm", "--group-size", "4", "--prompts-per-worker", "2")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("vllm-model"))


def _events(run: RunDir, kind: str, **match: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in read_events(run)
        if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())
    ]


def _step(run: RunDir) -> int:
    return max((e["step"] for e in _events(run, "step")), default=-1)


@pytest.fixture(scope="module")
def clean_final(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The clean run's final state (shared: every faulty run of the module must end there)."""
    run_dir = tmp_path_factory.mktemp("vllm-clean") / "clean"
    run_dir.mkdir()
    job = Job(
        run_dir, STEPS, *JOB_ARGS, "--model", str(model_dir), "--no-standby", "--timeout", "900"
    )
    try:
        yield job.finish(timeout=900)
    finally:
        job.close()
        kill_job_engines(job.run, 2)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DemoStack]:
    s = DemoStack(
        tmp_path / "stack", free_port(), job="engines", steps=STEPS, decode_ms=0.0, schedule=None
    )
    try:
        s.start_server()
        s.start_agent()
        yield s
    finally:
        s.stop()
        kill_job_engines(RunDir(s.run_dir), 2)


def _wait(stack: DemoStack, pred: Callable[[], Any], timeout: float, what: str) -> Any:
    def logs() -> str:
        return "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}"
            for f in sorted((stack.run_dir / "logs").glob("*.log"))
        )

    return wait_for(pred, timeout, what, interval=0.2, context=logs)


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as b:
        yield b


def _job_page_shows_both_engines_live(stack: DemoStack, browser: Any) -> None:
    """The Job page in Chromium: a row per engine with its admission, the step whose weights it
    serves, its train/inference disagreement and the live ``vllm:`` figures the agent scraped
    from the engine it found announced in the run directory (no --engine flag)."""
    from playwright.sync_api import expect

    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        page = ctx.new_page()
        page.set_default_timeout(15_000)
        sign_in_as(page, stack.url, stack.user, stack.password)
        page.goto(f"{stack.url}/jobs/{stack.job}")
        rows = page.locator("#job-engines tr[data-engine]")
        expect(rows).to_have_count(2, timeout=60_000)
        for rank in (0, 1):
            row = page.locator(f'#job-engines tr[data-engine="{rank}"]')
            # the panel polls: the figures arrive with the agent's next rounds
            expect(row.locator('td[data-label="KV cache"]')).to_contain_text("%", timeout=60_000)
            expect(row.locator('td[data-label="Running / waiting"]')).to_have_text(
                re.compile(r"^\d+ / \d+$")
            )
            expect(row.locator('td[data-label="|Δ logprob|"]')).to_have_text(
                re.compile(r"^[\d.e-]+ / [\d.e-]+$"), timeout=60_000
            )
            assert row.locator(".badge").inner_text() in ("admitted", "refitting")
            assert int(row.locator('td[data-label="Serves step"]').inner_text()) >= 1
    finally:
        ctx.close()


def _restart_action(stack: DemoStack, after: float) -> dict[str, Any] | None:
    for inc in stack.incidents():
        opened = datetime.fromisoformat(inc["opened_at"].replace("Z", "+00:00")).timestamp()
        subject = inc["subject"]
        if (
            opened < after - 2
            or subject.get("role") != "rollout"
            or str(subject.get("rank")) != "1"
        ):
            continue
        detail = stack.incident(inc["id"])
        for action in detail["actions"]:
            if action["action"] == "restart_role" and action["status"] in ("succeeded", "failed"):
                return {"incident": detail, "action": action}
    return None


def test_an_engine_killed_mid_request_is_healed_and_the_run_ends_as_a_clean_run(
    model_dir: Path, clean_final: dict[str, Any], stack: DemoStack
) -> None:
    run = RunDir(stack.run_dir)
    stack.start_job(*JOB_ARGS, "--model", str(model_dir), "--timeout", "900")
    _wait(
        stack,
        lambda: _events(run, "standby_ready", role="rollout"),
        400,
        "the standby engine to be up and asleep",
    )
    _wait(stack, lambda: _step(run) >= 2, 300, "step 2 (past the first-step escalation window)")

    # The kill lands while engine 1 has a request in flight: armed here, fired by the job's
    # router as it sends engine 1 its next request (polling the router's count from outside
    # would catch a busy engine only by chance).
    inject(run, Fault("kill-engine", rank=1))
    fault = _wait(
        stack,
        lambda: _events(run, "fault", fault="kill-engine", rank=1),
        120,
        "the armed kill of engine 1 to fire",
    )[0]
    record = records.read_record(run, 1)
    assert record is not None and fault["target_pid"] == record.pids["worker"], (fault, record)
    assert fault["in_flight"] >= 1, fault
    killed_at = fault["ts"]

    quarantined = _wait(
        stack, lambda: _events(run, "engine_quarantined", rank=1), 30, "engine 1 quarantined"
    )
    assert quarantined[0]["ts"] - killed_at < 5.0, quarantined
    found = _wait(
        stack,
        lambda: _restart_action(stack, killed_at),
        240,
        "RLGuard's restart_role of rollout-1 to finish",
    )
    action = found["action"]
    assert action["status"] == "succeeded", found
    # The hook's answer, on the incident's timeline as the action's result: the stages, in
    # order, the engine re-admitted at the version it was refit to.
    out = action["result"]["stdout"]
    stage = re.search(
        r"rollout-1: quarantined 0\.0 s, replaced ([\d.]+) s warm, up ([\d.]+) s, "
        r"refit to v(\d+) ([\d.]+) s, readmitted at v(\d+) ([\d.]+) s",
        out,
    )
    assert stage is not None, out
    replaced, up, refit_v, refit, readmit_v, readmit = stage.groups()
    assert refit_v == readmit_v, out
    assert 0 <= float(replaced) <= float(up) <= float(refit) <= float(readmit), out

    back = _events(run, "engine_readmitted", rank=1)[0]["ts"]
    retried = _events(run, "request_retried", engine=1)
    assert retried, "the kill landed with requests in flight, yet none was retried"

    _wait(stack, lambda: run.done.exists(), 600, "the run to finish")
    # Healed with current weights: no engine's train/inference disagreement was ever flagged.
    assert not [i for i in stack.incidents() if i["kind"] == "train_infer_mismatch"]
    final = read_json(run.final)
    assert final is not None
    assert final["step"] == clean_final["step"] == STEPS
    assert final["params_sha256"] == clean_final["params_sha256"]

    # The WAL: every request finished exactly once, each failed attempt was retried.
    wal = WriteAheadLog(run.wal, lock_timeout=30.0)
    try:
        entries = wal.entries()
    finally:
        wal.close()
    done = Counter(
        e.entry_id
        for e in entries
        if e.entry_id.endswith(".done") and e.status is WALStatus.COMPLETED
    )
    per_step = 2 * 2 * 4  # rollouts x prompts x group
    assert len(done) == STEPS * per_step and set(done.values()) == {1}
    failed = [e.entry_id for e in entries if e.status is WALStatus.FAILED]
    assert len(failed) == len(retried), (failed, retried)
    assert all(f.rsplit("-p", 1)[0] + ".done" in done for f in failed)
    # While engine 1 was out every request was sent to engine 0, the retries of the killed
    # requests among them. Counted by attempts *sent* in that window (an attempt's entry is
    # written as it is sent): a warm heal can take less than one request, so no request need
    # have *finished* in it (the CI run of 58c5a8f: a 2.7 s heal, none finished).
    sent = [
        e
        for e in entries
        if not e.entry_id.endswith(".done") and quarantined[0]["ts"] < e.created_at < back
    ]
    with WriteAheadLog(run.wal, lock_timeout=30.0) as wal:
        engines = {json.loads(wal.read_data(e.entry_id))["engine"] for e in sent}
    assert len(sent) >= len(retried) and engines == {0}, (
        len(sent),
        engines,
        quarantined[0]["ts"],
        back,
    )


def test_an_engine_admitted_with_the_previous_weights_is_caught_within_two_steps(
    model_dir: Path, stack: DemoStack, browser: Any
) -> None:
    """The chaos mode that skips one refit: engine 1 is admitted for a step with the weights of
    the step before. The trainer's log-probabilities of its tokens disagree with the engine's;
    the server opens ``train_infer_mismatch`` for that engine (medium, restart_role) before the
    trainer is two steps further. Until then no engine was ever flagged."""
    run = RunDir(stack.run_dir)
    stack.start_job(
        *JOB_ARGS, "--model", str(model_dir), "--no-standby", "--timeout", "900", "--steps", "40"
    )
    _wait(stack, lambda: _step(run) >= 3, 400, "step 3")
    # An engine slow to start (40-60 s on a loaded host) joins later: both must serve first.
    _wait(
        stack,
        lambda: {e["rank"] for e in _events(run, "engine_admitted")} >= {0, 1},
        300,
        "both engines admitted",
    )
    _job_page_shows_both_engines_live(stack, browser)
    assert not [i for i in stack.incidents() if i["kind"] == "train_infer_mismatch"]
    at = time.time()
    inject(run, Fault("skip-refit", rank=1))
    skipped = _wait(
        stack, lambda: _events(run, "chaos_refit_skipped", rank=1), 60, "the skipped refit"
    )[0]
    # The step trained on its stale samples: the first one after the skipped refit.
    stale_step = _wait(
        stack,
        lambda: next((e["step"] for e in _events(run, "step") if e["ts"] > skipped["ts"]), None),
        60,
        "the step after the skipped refit",
    )

    def caught() -> dict[str, Any] | None:
        for inc in stack.incidents():
            if inc["kind"] == "train_infer_mismatch" and inc["subject"].get("rank") in (1, "1"):
                return inc
        return None

    inc = _wait(stack, caught, 120, "train_infer_mismatch for engine 1")
    opened = datetime.fromisoformat(inc["opened_at"].replace("Z", "+00:00")).timestamp()
    two_later = [e["ts"] for e in _events(run, "step") if e["step"] == stale_step + 2]
    assert not two_later or opened <= two_later[0], (inc, stale_step)
    assert opened >= at - 1 and inc["tier"] == "medium", inc
    detail = stack.incident(inc["id"])
    assert [a["action"] for a in detail["actions"]] == ["restart_role"], detail["actions"]
    # Only the stale engine was flagged.
    assert {
        str(i["subject"].get("rank"))
        for i in stack.incidents()
        if i["kind"] == "train_infer_mismatch"
    } == {"1"}


def test_a_wedged_engine_is_quarantined_then_readmitted_on_probation_at_the_current_version(
    model_dir: Path, clean_final: dict[str, Any], tmp_path: Path
) -> None:
    """The job's own router, nothing else watching: engine 1 is paused (vLLM's ``/pause``, its
    requests frozen while ``/health`` answers 200). Its request times out and it is quarantined
    with its process tree alive; its probation probe fails while it stays paused; once resumed,
    the next probe passes, it is refit to the trainer's version (it missed steps meanwhile) and
    re-admitted, and it serves again. The run ends with the clean run's parameters."""
    import httpx

    run_dir = tmp_path / "probation"
    run_dir.mkdir()
    job = Job(
        run_dir,
        STEPS,
        *JOB_ARGS,
        "--model",
        str(model_dir),
        "--no-standby",
        "--timeout",
        "900",
        "--engine-probation",
        "1",
        "--engine-request-timeout",
        "10",
    )
    run = job.run

    def since(ts: float, kind: str, **match: Any) -> list[dict[str, Any]]:
        # only what the pause caused (a loaded host may time a request out before it)
        return [e for e in _events(run, kind, **match) if e["ts"] >= ts]

    try:
        # Paused as soon as both serve: the run (~1 s a step on a quiet host) must outlast the
        # request's timeout, a failed probe and the re-admission (~18 s).
        job.wait(
            lambda: {e["rank"] for e in _events(run, "engine_admitted")} >= {0, 1},
            600,
            "both engines admitted",
        )
        record = records.read_record(run, 1)
        assert record is not None
        paused_at = time.time()
        httpx.post(f"{record.url}/pause", params={"mode": "keep"}, timeout=30).raise_for_status()
        try:
            quarantined = job.wait(
                lambda: since(paused_at, "engine_quarantined", rank=1), 60, "engine 1 quarantined"
            )[0]
            assert "failed" in quarantined["why"], quarantined
            job.wait(
                lambda: since(quarantined["ts"], "engine_probation", rank=1, outcome="failed"),
                60,
                "a failed probation probe while engine 1 is paused",
            )
            assert not since(paused_at, "engine_readmitted", rank=1)  # never while wedged
            # The trainer steps on without it (on engine 0): engine 1 comes back stale.
            job.wait(
                lambda: since(quarantined["ts"], "step"),
                120,
                "a step trained while engine 1 is out",
            )
        finally:
            resumed_at = time.time()
            httpx.post(f"{record.url}/resume", timeout=30).raise_for_status()
        healthy = job.wait(
            lambda: since(resumed_at, "engine_probation", rank=1, outcome="healthy"),
            60,
            "a passed probation probe once engine 1 is resumed",
        )[0]
        assert healthy["refit_first"] is True, healthy
        back = job.wait(
            lambda: since(resumed_at, "engine_readmitted", rank=1), 60, "engine 1 re-admitted"
        )[0]
        # At the trainer's version (the target may have moved on during the refit: refit again)
        assert back["probation"] is True, back
        assert back["version"] >= healthy["target"] > (healthy["version"] or 0), (back, healthy)
        # The same process tree throughout: probation, not a replacement.
        assert back["incarnation"] == record.incarnation, (back, record)
        assert not _events(run, "engine_replaced")
        final = job.finish(timeout=900)
    finally:
        job.close()
        kill_job_engines(run, 2)
    assert final["step"] == clean_final["step"] == STEPS
    assert final["params_sha256"] == clean_final["params_sha256"]
    # Engine 1 served again after its re-admission: attempts sent to it, finished.
    with WriteAheadLog(run.wal, lock_timeout=30.0) as wal:
        entries = wal.entries()
        after = [
            json.loads(wal.read_data(e.entry_id))
            for e in entries
            if not e.entry_id.endswith(".done")
            and e.created_at > back["ts"]
            and e.status is WALStatus.COMPLETED
        ]
    assert any(a["engine"] == 1 for a in after), "engine 1 got no request after re-admission"
