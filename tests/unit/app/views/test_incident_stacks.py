"""Hang forensics on the incident page: each capture's stacks in a <pre> (escaped: the text is
whatever the process's frames say), collapsed when long; a failed capture shows its reason."""

from __future__ import annotations

import re

from app.incidents.stacks import record_stacks
from app.models import utcnow
from tests.harness.dashboard import Browser, DashboardApp, login, seed_heavy_incident

STACKS = re.compile(r'<details class="stacks" data-testid="stacks"( open)?>(.*?)</details>', re.S)


def test_the_incident_page_shows_stacks_escaped_and_collapses_long_ones(
    dash: DashboardApp, client: Browser
) -> None:
    seeded = seed_heavy_incident(dash)
    short = "Thread 7 (idle)\n    wait_for <b>peer</b> (dist.py:3)\n"
    long = "".join(f"    frame_{i} (m.py:{i})\n" for i in range(60))
    with dash.session() as s:
        record_stacks(
            s, incident_id=seeded.incident_id, action_id=1, node="node-1", actor="worker:w",
            now=utcnow(), captures=[
                {"role": "trainer", "rank": 0, "pid": 7, "ok": True, "text": short},
                {"role": "rollout", "rank": 1, "pid": 8, "ok": False,
                 "reason": "process gone: it exited (-9) before the capture"},
            ],
        )
        record_stacks(
            s, incident_id=seeded.incident_id, action_id=2, node="node-1", actor="worker:w",
            now=utcnow(), captures=[{"role": "trainer", "rank": 0, "pid": 9, "ok": True,
                                     "text": long}],
        )
        s.commit()
    login(client, "vera")
    html = client.get(f"/incidents/{seeded.incident_id}").text
    (short_open, short_html), (long_open, long_html) = STACKS.findall(html)
    assert short_open == " open" and long_open == ""  # 60 lines start collapsed
    assert "<pre>" in short_html
    assert "wait_for &lt;b&gt;peer&lt;/b&gt; (dist.py:3)" in short_html and "<b>peer" not in html
    assert "frame_59 (m.py:59)" in long_html and "61 lines" in long_html
    assert "No Python stacks" in html
    assert "process gone: it exited (-9) before the capture" in html
    # The live partial (htmx polling) renders the same blocks.
    live = client.get(f"/ui/incidents/{seeded.incident_id}/timeline",
                      headers={"HX-Request": "true"}).text
    assert len(STACKS.findall(live)) == 2
