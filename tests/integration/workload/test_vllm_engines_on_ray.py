"""The reference job in Ray mode on a real vLLM engine (``--ray --rollout-engine vllm``): the
rollout actor hosts the engine (``workload.engines.engine_host``), the trainer actor refits it.

kill -9 of the engine's Worker while it has a request in flight -> the engine's API server exits,
its host fails, the actor's process exits and Ray restarts the actor, whose host kills what is
left of the old engine and starts a new one; the trainer refits it to its current weight version
and re-admits it only at that version; the lost requests are retried from the rollout WAL; and
the run ends with the same parameters, bit for bit, as a clean run under the process supervisor
(per-request seeds), every consumed batch byte-identical."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.vllm_engines import kill_job_engines, tiny_model_dir
from tests.integration.workload._jobs import Job, assert_same_end
from workload.chaos import Fault, inject
from workload.engines import records

# It starts its own Ray in the launcher process (ray.init never runs in this test process), so
# it runs with the other engine tests, not in the Ray tests' own pytest process.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]
STEPS = 4
ARGS = (
    "--rollout-engine",
    "vllm",
    "--rollouts",
    "1",
    "--group-size",
    "4",
    "--prompts-per-worker",
    "2",
    "--timeout",
    "800",
)


def test_an_engine_killed_under_ray_is_restarted_refit_and_the_run_ends_as_a_clean_run(
    tmp_path: Path,
) -> None:
    model = str(tiny_model_dir(tmp_path / "model"))
    clean = Job(tmp_path / "clean", STEPS, *ARGS, "--model", model, "--no-standby")
    on_ray = Job(tmp_path / "on-ray", STEPS, *ARGS, "--model", model, "--ray")
    try:
        on_ray.wait(lambda: on_ray.events("ray_start"), 120, "the Ray actors")
        on_ray.wait(
            lambda: [e for e in on_ray.events("consumed") if e["step"] == 1],
            400,
            "step 1 trained on the engine",
        )
        first = records.read_record(on_ray.run, 0)
        assert first is not None
        # Armed here, fired by the trainer's router as it sends the engine its next request.
        inject(on_ray.run, Fault("kill-engine", rank=0))
        fault = on_ray.wait(
            lambda: [e for e in on_ray.events("fault") if e.get("fault") == "kill-engine"],
            120,
            "the armed kill of the engine to fire",
        )[0]
        assert fault["target_pid"] == first.pids["worker"] and fault["in_flight"] >= 1, fault
        assert_same_end(on_ray, clean, STEPS, timeout=600)
    finally:
        on_ray.close()
        clean.close()
        kill_job_engines(on_ray.run, 1)
        kill_job_engines(clean.run, 1)

    ups = on_ray.events("engine_up")
    assert [e["rank"] for e in ups] == [0, 0], ups
    # The second engine was started by another host process: the actor Ray restarted.
    assert ups[1]["pid"] != first.host_pid, (ups, first)
    assert [e["rank"] for e in on_ray.events("engine_exit")] == [0]
    # Re-admitted only once it served the trainer's weights: the refit before its admission
    # loaded the version the trainer had published by then.
    assert on_ray.events("engine_quarantined"), "the dead engine was never quarantined"
    admitted = [e for e in on_ray.events("engine_readmitted") if e["ts"] > ups[1]["ts"]]
    assert admitted, on_ray.events("engine_admitted")
    refits = [
        e for e in on_ray.events("engine_refit") if ups[1]["ts"] < e["ts"] <= admitted[0]["ts"]
    ]
    assert refits, on_ray.events("engine_refit")
    assert refits[-1]["served"] == refits[-1]["version"] == admitted[0]["version"]
    assert admitted[0]["version"] > 1_000_000  # not the initial weights: the step's current ones
