"""Smoke run of benchmarks/ray_collector.py on its recorded fixture (tiny size, no timing claim)."""

from __future__ import annotations

import json

from benchmarks.ray_collector import FIXTURE, measure, scaled_answer


def test_the_recorded_answer_is_rays_shape_with_a_death_cause() -> None:
    recorded = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert recorded["ray_version"] == "2.60.0"
    dead = [a for a in recorded["actors"] if a["state"] == "DEAD"]
    assert dead and dead[0]["death_cause"]["actor_died_error_context"]["reason"] == "WORKER_DIED"
    scaled = scaled_answer(50)
    assert len({a["actor_id"] for a in scaled["actors"]}) == 50


def test_smoke_run_maps_every_actor_and_times_both() -> None:
    got = measure(actors=100, rounds=2)
    assert got["collector_ms"] > 0 and got["baseline_ms"] > 0
