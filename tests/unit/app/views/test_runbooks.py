"""Runbooks: one per fault kind (fails when a FaultKind has none, or one lacks a section), one
behind every Prometheus rule's runbook_url, served rendered (raw HTML escaped, unknown names
404) and linked from the incident and approval pages."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from app.policy.signals import FaultKind
from app.views.models.runbooks import RUNBOOK_DIR, load_runbook, runbook_names
from tests.harness.dashboard import Browser, DashboardApp, login, seed_heavy_incident

RULES = Path(__file__).resolve().parents[4] / "deploy" / "prometheus" / "rules.yml"
SECTIONS = ("## What it means", "## What RLGuard does", "## What to check", "## Approve or reject")


def test_every_fault_kind_has_a_runbook_with_every_section() -> None:
    missing = [k.value for k in FaultKind if not (RUNBOOK_DIR / f"{k.value}.md").is_file()]
    assert missing == [], f"write docs/runbooks/<kind>.md for: {', '.join(missing)}"
    for kind in FaultKind:
        text = (RUNBOOK_DIR / f"{kind.value}.md").read_text(encoding="utf-8")
        assert text.startswith(f"# {kind.value} "), kind
        absent = [s for s in SECTIONS if s not in text]
        assert absent == [], f"docs/runbooks/{kind.value}.md lacks {absent}"


def test_every_prometheus_alert_rule_links_an_existing_runbook() -> None:
    doc = yaml.safe_load(RULES.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for rule in alerts:
        url = rule.get("annotations", {}).get("runbook_url")
        assert url, f"{rule['alert']} has no runbook_url annotation"
        path = urlsplit(url).path
        assert path.startswith("/runbooks/"), (rule["alert"], url)
        assert path.removeprefix("/runbooks/") in runbook_names(), (rule["alert"], url)


def test_rendering_escapes_raw_html_and_refuses_names_outside_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "demo_kind.md").write_text(
        "# demo_kind — a test\n\n<script>alert(1)</script>\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n"
    )
    (tmp_path / "outside.txt").write_text("# not a runbook\n")
    monkeypatch.setattr("app.views.models.runbooks.RUNBOOK_DIR", tmp_path)
    book = load_runbook("demo_kind")
    assert book is not None and book.title == "demo_kind — a test"
    assert "<script>" not in book.html and "&lt;script&gt;" in book.html
    assert "<table>" in book.html
    for name in ("outside", "../runbooks/demo_kind", "DEMO_KIND", "nope", ""):
        assert load_runbook(name) is None, name


def test_the_runbook_page_is_rendered_and_linked_from_incident_and_approval(
    client: Browser, dash: DashboardApp
) -> None:
    seeded = seed_heavy_incident(dash)  # a storage_unwritable incident waiting for approval
    login(client, "vera")
    incident = client.get(f"/incidents/{seeded.incident_id}")
    assert 'href="/runbooks/storage_unwritable" data-testid="runbook-link"' in incident.text
    approval = client.get(f"/approvals/{seeded.approval_id}")
    assert 'href="/runbooks/storage_unwritable" data-testid="runbook-link"' in approval.text
    page = client.get("/runbooks/storage_unwritable")
    assert page.status_code == 200
    assert "<h2>Approve or reject</h2>" in page.text and "<code>enter_safe_mode</code>" in page.text
    listing = client.get("/runbooks")
    assert listing.status_code == 200 and 'href="/runbooks/heartbeat_lost"' in listing.text
    missing = client.get("/runbooks/no_such_kind")
    assert missing.status_code == 404 and "no_such_kind" in missing.text
