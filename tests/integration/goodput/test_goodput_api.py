"""The goodput ledger through the real app (SQLite and PostgreSQL): a job's history with known
faults (see ``_history``), every figure checked to the second; overlapping incidents counted
once; the SAFE_MODE wait charged to approval; a job with no fault at ETTR 1.0; bad input."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from app.models import Role
from tests.harness import Api, auth
from tests.integration.goodput._history import (
    CALM,
    JOB,
    build_incidents,
    ingest_steps,
    start,
    trainer_steps,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SETTINGS: dict[str, Any] = {
    "goodput": {"gpus_per_node": 4, "human_detection_delay_seconds": 100.0},
    "policy": {"checkpoint_interval_steps": 15},
}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def history(
    migrated_url: str, make_api: Callable[..., Api]
) -> tuple[Api, float, dict[str, int], str]:
    api = make_api(migrated_url, **SETTINGS)
    t0 = start()
    ingest_steps(api, t0, job=JOB, steps=trainer_steps())
    ingest_steps(api, t0, job=CALM, steps=[(10.0 * i, i) for i in range(0, 80)])
    api.user_token("alice", Role.approver)
    ids = build_incidents(api.engine, t0)
    return api, t0, ids, api.user_token("vera", Role.viewer)


def test_every_figure_of_the_ledger_to_the_second(
    history: tuple[Api, float, dict[str, int], str],
) -> None:
    api, t0, ids, viewer = history
    r = api.client.get(
        f"/api/v1/jobs/{JOB}/goodput",
        params={"since": _iso(t0 - 60), "until": _iso(t0 + 900)},
        headers=auth(viewer),
    )
    assert r.status_code == 200, r.text
    g = r.json()
    assert g["wall_seconds"] == 960
    # A and B overlap on [200, 250): counted once; C costs [450, 710).
    assert g["lost_seconds"] == 310 and g["productive_seconds"] == 650
    assert g["ettr"] == pytest.approx(650 / 960)
    assert g["gpu_count"] == 8  # two nodes, no GPU reported: 4 each (the setting)
    assert g["gpu_hours_lost"] == pytest.approx(310 / 3600 * 8)
    assert g["cost_lost"] == pytest.approx(310 / 3600 * 8 * 2.5)
    assert g["segments"] == {"detect": 11, "approve": 240, "recover": 60, "redo": 49}
    rows = {i["id"]: i for i in g["incidents"]}
    a, b, c = rows[ids["A"]], rows[ids["B"]], rows[ids["C"]]
    expected = {
        "A": (
            a,
            204,
            210,
            230,
            260,
            50,
            50,
            {"detect": 6, "approve": 0, "recover": 20, "redo": 24},
            2,
            214,
            5,
        ),
        "B": (
            b,
            215,
            215,
            262,
            270,
            50,
            0,
            {"detect": 0, "approve": 0, "recover": 35, "redo": 15},
            2,
            225,
            5,
        ),
        # SAFE_MODE: requested 460, rejected 560, release asked 700 -> 240 s of approval.
        "C": (
            c,
            455,
            460,
            705,
            720,
            260,
            260,
            {"detect": 5, "approve": 240, "recover": 5, "redo": 10},
            0,
            265,
            10,
        ),
    }
    for name, (
        row,
        fault,
        det,
        rec,
        res,
        lost,
        counted,
        seg,
        redone,
        cf,
        cf_redone,
    ) in expected.items():
        assert _ts(row["fault_at"]) - t0 == fault, name
        assert _ts(row["detected_at"]) - t0 == det, name
        assert _ts(row["recovered_at"]) - t0 == rec, name
        assert _ts(row["resumed_at"]) - t0 == res, name
        assert (row["lost_seconds"], row["counted_seconds"]) == (lost, counted), name
        assert row["segments"] == seg, name
        assert row["steps_redone"] == redone and not row["ongoing"], name
        assert row["whole_job_restart_seconds"] == cf, name
        assert row["whole_job_restart_steps_redone"] == cf_redone, name
    cf = g["counterfactual"]
    # Whole-job restart: partial step + 100 s (human) + 60 s start-up (first report at -60,
    # first step at 10, less one 10 s step) + steps since the checkpoint (every 15) x 10 s.
    assert cf["assumptions"] == {
        "human_detection_seconds": 100.0,
        "startup_seconds": 60.0,
        "startup_source": "measured",
        "typical_step_seconds": 10.0,
        "price_per_gpu_hour": 2.5,
        "gpu_count": 8,
        "gpu_count_source": "default",
        "checkpoint_source": "assumed every 15 steps",
        # none of these kinds has a counterfactual class of its own (policy.yaml)
        "classes": [],
        "summary": "a person notices after 100 s and the job restarts in its measured 60 s",
    }
    assert cf["lost_seconds"] == 490  # [200, 425) and [450, 715)
    assert cf["ettr"] == pytest.approx(650 / 1140)
    assert cf["gpu_hours_saved"] == pytest.approx(180 / 3600 * 8)
    assert cf["money_saved"] == pytest.approx(180 / 3600 * 8 * 2.5)
    series = g["series"]
    assert len(series) == 16  # 960 s in minutes
    assert sum(
        (1 - p["ettr"]) * (_ts(p["end"]) - _ts(p["start"])) for p in series
    ) == pytest.approx(310)
    assert series[4]["ettr"] == pytest.approx(20 / 60)  # [180, 240): lost from 200

    # A window that starts inside C counts only C's part in it.
    r = api.client.get(
        f"/api/v1/jobs/{JOB}/goodput",
        params={"since": _iso(t0 + 600), "until": _iso(t0 + 800)},
        headers=auth(viewer),
    )
    part = r.json()
    assert part["wall_seconds"] == 200 and part["lost_seconds"] == 110
    assert [i["id"] for i in part["incidents"]] == [ids["C"]]
    assert part["incidents"][0]["counted_seconds"] == 110

    # No fault: ETTR 1.0, nothing lost, nothing saved.
    calm = api.client.get(
        f"/api/v1/jobs/{CALM}/goodput",
        params={"since": _iso(t0), "until": _iso(t0 + 700)},
        headers=auth(viewer),
    ).json()
    assert calm["ettr"] == 1.0 and calm["lost_seconds"] == 0 and calm["incidents"] == []
    assert calm["counterfactual"]["gpu_hours_saved"] == 0

    # /metrics: the ETTR over the last 24 h and the GPU-hours lost over the job's life.
    day = api.client.get(
        f"/api/v1/jobs/{JOB}/goodput", params={"since": "24h"}, headers=auth(viewer)
    ).json()
    text = api.client.get("/metrics").text
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("rlguard_job_")
    }
    assert values[f'rlguard_job_gpu_hours_lost_total{{job="{JOB}"}}'] == pytest.approx(
        310 / 3600 * 8
    )
    assert values[f'rlguard_job_ettr_ratio{{job="{JOB}"}}'] == pytest.approx(day["ettr"], rel=1e-3)
    assert values[f'rlguard_job_ettr_ratio{{job="{CALM}"}}'] == 1.0
    assert values[f'rlguard_job_gpu_hours_lost_total{{job="{CALM}"}}'] == 0.0


BAD = [
    ({"since": "yesterday"}, 422, "since 'yesterday' is neither a duration"),
    ({"since": "2026-11-30T08:00:00"}, 422, "must carry a time zone"),
    ({"until": "7q"}, 422, "until '7q' is neither"),
    ({"since": "1h", "until": "2h"}, 422, "must be before until"),
    ({"since": "0d"}, 422, "since '0d' is not a positive duration"),
    ({"since": "2999-01-01T00:00:00Z", "until": "2999-01-02T00:00:00Z"}, 422, "is in the future"),
    ({"since": "400d"}, 422, "longer than 90 days"),
]


def test_bad_input_is_refused_with_the_reason(api: Api) -> None:
    viewer = api.user_token("vera", Role.viewer)
    ingest_steps(api, start(), job=JOB, steps=[(0.0, 0), (10.0, 1)])
    for params, status, reason in BAD:
        r = api.client.get(f"/api/v1/jobs/{JOB}/goodput", params=params, headers=auth(viewer))
        assert r.status_code == status and reason in r.json()["detail"], (params, r.text)
    r = api.client.get("/api/v1/jobs/nope/goodput", headers=auth(viewer))
    assert r.status_code == 404 and "no job named 'nope'" in r.json()["detail"]
    assert api.client.get(f"/api/v1/jobs/{JOB}/goodput").status_code == 401
