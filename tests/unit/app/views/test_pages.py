"""Every page and partial renders real data; partials stop polling when final; bad filters."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta

from app.incidents.timeline import add_event
from app.models import Job, MetricRollup, Node, Participant, from_epoch, utcnow
from app.models.incident import Incident, IncidentEventType
from app.series.store import SeriesKey
from tests.harness.dashboard import Browser, DashboardApp, login, seed_heavy_incident

HX = {"HX-Request": "true"}


def _chart_specs(html: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"data-spec='([^']*)'", html)]


def _fleet(dash: DashboardApp) -> float:
    now = time.time()
    with dash.session() as s:
        s.add(
            Node(
                name="node-1",
                last_seen_at=from_epoch(now - 1),
                fingerprint={"torch": "2.13.0"},
                fingerprint_hash="ab" * 32,
            )
        )
        s.add(Node(name="node-2", last_seen_at=from_epoch(now - 90)))  # silent past confirmation
        s.add(Job(name="grpo-a", last_seen_at=from_epoch(now - 1)))
        s.flush()
        s.add(
            Participant(
                job_name="grpo-a",
                role="trainer",
                rank=0,
                node_name="node-1",
                phase="TRAIN",
                step=41,
                last_heartbeat_at=from_epoch(now - 2),
            )
        )
        s.add(
            Participant(
                job_name="grpo-a",
                role="rollout",
                rank=1,
                node_name="node-2",
                phase="ROLLOUT",
                step=41,
                last_heartbeat_at=from_epoch(now - 20),
            )
        )
        minute = from_epoch(now).replace(second=0, microsecond=0) - timedelta(minutes=5)
        s.add(
            MetricRollup(
                series_id="x1",
                node="node-1",
                name="gpu_utilization_ratio",
                labels={"gpu": "0"},
                minute=minute,
                count=60,
                min=0.5,
                max=0.9,
                avg=0.7,
                last=0.8,
                last_ts=minute.timestamp() + 59,
            )
        )
        s.commit()
    store = dash.store
    for t in range(30):
        ts = now - 30 + t
        store.append(SeriesKey.of("node-1", "gpu_utilization_ratio", {"gpu": "0"}), ts, 0.9)
        store.append(SeriesKey.of("node-1", "gpu_temperature_celsius", {"gpu": "0"}), ts, 71.0)
        store.append(SeriesKey.of("node-1", "gpu_utilization_ratio", {"gpu": "1"}), ts, 0.8)
        store.append(
            SeriesKey.of("node-1", "gpu_temperature_celsius", {"gpu": "1"}), ts, 92.0
        )  # too hot
        store.append(
            SeriesKey.of("node-1", "gpu_xid_critical_events_total", {"gpu": "1"}),
            ts,
            0 if t < 20 else 1,
        )
        labels = {"job": "grpo-a", "role": "rollout", "rank": "1"}
        store.append(
            SeriesKey.of("node-2", "rollout_pending_ratio", labels), ts, 0.05 if t < 20 else 0.45
        )
        store.append(SeriesKey.of("node-1", "job_safe_mode", {"job": "grpo-a"}), ts, 0)
    return now


def test_overview_shows_nodes_gpus_jobs_and_incidents(client: Browser, dash: DashboardApp) -> None:
    now = _fleet(dash)
    seed_heavy_incident(dash, node="node-1")
    login(client, "vera")
    page = client.get("/")
    rendered = time.time()
    assert page.status_code == 200
    html = page.text
    # node-1 has a GPU at 92 °C and an open heavy incident: critical; node-2 is silent for 90 s
    # at seeding, and older by however long seeding and rendering took (a loaded machine).
    assert re.search(r'data-node="node-1" data-level="bad"', html)
    assert re.search(r'data-node="node-2" data-level="bad"', html)
    silent = re.search(r"silent (\d+)s", html)
    assert silent, "node-2 is not shown as silent"
    assert 89 <= int(silent.group(1)) <= 91 + (rendered - now)
    assert 'data-testid="open-incidents">1<' in html
    assert "State log not writable on node-1" in html
    assert 'href="/jobs/grpo-a"' in html and "1 suspected" in html
    sparks = json.loads(re.search(r"id=\"node-sparks\" data-json='([^']*)'", html).group(1))
    # One shared axis: the rollup minute five minutes ago, then "now" with the live value.
    assert len(sparks["x"]) == 2 and sparks["x"][0] < time.time() - 240
    assert sparks["util"]["node-1"] == [70.0, 85.0]  # rollup avg 0.7; live mean of 0.9 and 0.8
    assert sparks["temp"]["node-1"][-1] == 92.0  # the hottest GPU
    assert sparks["util"]["node-2"] == [None, None]  # silent node: no values, no fake line
    assert 'data-spark-node="node-1"' in html
    assert "<script" not in html.split("</head>")[1]  # htmx would drop scripts from swaps
    for partial in ("/ui/overview/health", "/ui/overview/incidents", "/ui/overview/jobs"):
        r = client.get(partial, headers=HX)
        assert r.status_code == 200
        assert "<html" not in r.text
        assert 'hx-swap="outerHTML"' in r.text and 'hx-trigger="every' in r.text


def test_overview_with_an_empty_cluster(client: Browser) -> None:
    login(client, "vera")
    html = client.get("/").text
    assert "No node has reported yet" in html
    assert 'data-testid="no-incidents"' in html


def test_node_page(client: Browser, dash: DashboardApp) -> None:
    _fleet(dash)
    login(client, "vera")
    html = client.get("/nodes/node-1").text
    assert "92 °C" in html and "critical" in html
    assert "critical XID events" in html  # the counter moved from 0 to 1
    assert "torch" in html and "2.13.0" in html
    specs = _chart_specs(html)
    temp = next(s for s in specs if s["unit"] == "°C")
    assert [t["value"] for t in temp["thresholds"]] == [83.0, 90.0]
    assert {s["label"] for s in temp["series"]} == {"GPU 0", "GPU 1"}
    # the node's ingest quotas, each with the setting that raises it (app/ingest/quotas.py)
    assert 'data-testid="node-quotas"' in html and "RLGUARD_NODE_QUOTAS__MAX_SERIES" in html
    partial = client.get("/ui/nodes/node-1/quotas").text
    assert partial.startswith("<section") and "RLGUARD_NODE_QUOTAS__MAX_JOBS" in partial
    r = client.get("/nodes/nope")
    assert r.status_code == 404 and "no node named &#39;nope&#39;" in r.text


def test_job_page_golden_metrics_with_bands(client: Browser, dash: DashboardApp) -> None:
    _fleet(dash)
    login(client, "vera")
    html = client.get("/jobs/grpo-a").text
    assert "confirmed lost" not in html and "suspected" in html  # rollout/1 silent for 20 s
    specs = _chart_specs(html)
    pending = next(s for s in specs if any(t["value"] == 0.3 for t in s["thresholds"]))
    assert pending["bands"] == [
        {"from": None, "to": 0.1, "level": "ok"},
        {"from": 0.1, "to": 0.3, "level": "warn"},
        {"from": 0.3, "to": None, "level": "bad"},
    ]
    assert pending["series"][0]["label"] == "rollout/1"
    assert max(v for v in pending["series"][0]["values"] if v is not None) == 0.45
    assert "Incidents of this job" in html and "No incident for this job." in html
    part = client.get("/ui/jobs/grpo-a/participants", headers=HX)
    assert 'data-participant="trainer/0"' in part.text and "<html" not in part.text
    assert client.get("/jobs/none").status_code == 404


def test_incident_detail_evidence_and_polling_stops_when_final(
    client: Browser, dash: DashboardApp
) -> None:
    seeded = seed_heavy_incident(dash)
    login(client, "vera")
    html = client.get(f"/incidents/{seeded.incident_id}").text
    evidence = _chart_specs(html)[0]
    assert evidence["thresholds"][0]["value"] == 200.0
    assert evidence["window"][1] - evidence["window"][0] == 20.0
    assert "Job put in SAFE_MODE" in html and "Approval requested" in html
    live = client.get(f"/ui/incidents/{seeded.incident_id}/timeline", headers=HX).text
    assert 'data-final="false"' in live and "hx-trigger=" in live
    with dash.session() as s:
        inc = s.get(Incident, seeded.incident_id)
        assert inc is not None
        inc.status, inc.open_key, inc.resolved_at = "resolved", None, utcnow()
        from app.models.action import RecoveryAction

        for a in s.exec(__import__("sqlmodel").select(RecoveryAction)).all():
            if a.status == "pending_approval":
                a.status = "cancelled"
        add_event(s, incident_id=inc.id, type_=IncidentEventType.RESOLVED)
        s.commit()
    final = client.get(f"/ui/incidents/{seeded.incident_id}/timeline", headers=HX).text
    assert 'data-final="true"' in final and "hx-trigger=" not in final
    assert "Resolved" in final
    assert client.get("/incidents/424242").status_code == 404


def test_incident_list_filters_partial_and_vary(client: Browser, dash: DashboardApp) -> None:
    seed_heavy_incident(dash)
    login(client, "vera")
    full = client.get("/incidents?status=open&tier=heavy")
    assert full.headers["Vary"] == "HX-Request"
    assert "<html" in full.text and "State log not writable" in full.text
    part = client.get("/incidents?status=open&tier=heavy", headers=HX)
    assert part.headers["Vary"] == "HX-Request"
    assert (
        "<html" not in part.text and 'hx-get="/incidents?status=open&amp;tier=heavy"' in part.text
    )
    assert "No incident matches" in client.get("/incidents?status=resolved").text
    bad = client.get("/incidents?tier=apocalyptic")
    assert bad.status_code == 400 and "apocalyptic" in bad.headers["X-RLGuard-Reason"]
    bad = client.get("/incidents?status=maybe")
    assert bad.status_code == 400 and "maybe" in bad.text


def test_audit_page_filters_and_paging(client: Browser, dash: DashboardApp) -> None:
    login(client, "adam")
    html = client.get("/audit?action=web.").text
    assert "web.login" in html and "user.create" not in html
    part = client.get("/audit?actor=adam", headers=HX)
    assert part.headers["Vary"] == "HX-Request" and "<html" not in part.text
    r = client.get("/audit?before=0")
    assert r.status_code == 400 and "before=0" in r.headers["X-RLGuard-Reason"]
    assert client.get("/audit?action=" + "x" * 200).status_code == 400


def test_settings_page_masks_secrets(client: Browser, dash: DashboardApp) -> None:
    dash.settings.redis_url = "redis://:hunter2secret@10.0.0.5:6379/0"
    login(client, "vera")
    html = client.get("/settings").text
    assert "hunter2secret" not in html and "***" in html
    assert dash.settings.secret_key not in html and "set (hidden)" in html
    assert "rollout_pending_ratio" in html and "detection.heartbeat.suspect_seconds" in html


def test_alerts_page_lists_deliveries_and_refuses_bad_state(
    client: Browser, dash: DashboardApp
) -> None:
    from app.models.alert import AlertDelivery

    seeded = seed_heavy_incident(dash)
    now = utcnow()
    with dash.session() as s:
        s.add(
            AlertDelivery(
                dedupe_key="k1",
                incident_id=seeded.incident_id,
                event_id="e1",
                event_kind="approval_requested",
                tier="heavy",
                channel="oncall-wecom",
                channel_type="wecom",
                event={},
                occurred_at=now,
                due_at=now,
                state="failed",
                attempts=5,
                response_code=200,
                last_error="errcode 45009 (rate limited)",
            )
        )
        s.commit()
    login(client, "vera")
    html = client.get("/alerts").text
    assert "oncall-wecom" in html and "errcode 45009" in html
    assert client.get("/alerts?state=sent").text.count("oncall-wecom") == 0
    r = client.get("/alerts?state=lost")
    assert r.status_code == 400 and "state='lost'" in r.headers["X-RLGuard-Reason"]


def test_static_assets_are_served_locally(client: Browser) -> None:
    html = client.get("/login").text
    scripts = re.findall(r'<script src="([^"]+)"', html)
    assert scripts and all(src.startswith("/static/") for src in scripts)
    assert "cdn" not in html.lower() and "https://" not in html
    for src in scripts + re.findall(r'<link rel="stylesheet" href="([^"]+)"', html):
        assert client.get(src).status_code == 200, src


def test_overview_sees_a_gpu_that_appears_later(client: Browser, dash: DashboardApp) -> None:
    now = _fleet(dash)
    login(client, "vera")
    first = client.get("/ui/overview/health", headers=HX).text
    card = re.search(r'data-node="node-1".*?</a>', first, re.S).group(0)
    assert card.count('class="gpu-dot ') == 2
    dash.store.append(SeriesKey.of("node-1", "gpu_utilization_ratio", {"gpu": "2"}), now, 0.5)
    again = client.get("/ui/overview/health", headers=HX).text
    card = re.search(r'data-node="node-1".*?</a>', again, re.S).group(0)
    assert card.count('class="gpu-dot ') == 3


def test_settings_page_shows_the_running_policy(client: Browser, dash: DashboardApp) -> None:
    login(client, "vera")
    html = client.get("/settings").text
    assert "Policy file" in html
    assert "tiers.storage_unwritable.tier" in html and "heavy" in html
    assert "approval.expire_seconds" in html


def test_job_bands_follow_the_running_policy(client: Browser, dash: DashboardApp) -> None:
    from app.policy.policy_file import default_policy, parse_policy

    data = default_policy().model_dump(mode="json")
    data["golden_metrics"]["rollout_pending_ratio"]["warning"] = 0.5
    dash.app.state.policy = parse_policy(data)
    _fleet(dash)
    login(client, "vera")
    specs = _chart_specs(client.get("/jobs/grpo-a").text)
    pending = next(s for s in specs if s["series"] and s["series"][0]["label"] == "rollout/1")
    assert [t["value"] for t in pending["thresholds"]] == [0.1, 0.5]
    assert "&gt; 0.50" in client.get("/settings").text
