"""Hang forensics on the incident page: each capture's stacks in a <pre> (escaped: the text is
whatever the process's frames say), collapsed when long; a failed capture shows its reason."""

from __future__ import annotations

import re

from app.incidents.stacks import record_stacks
from app.models import utcnow
from tests.harness.dashboard import Browser, DashboardApp, login, seed_heavy_incident

STACKS = re.compile(
    r'<details class="stacks" data-testid="stacks" id="(stacks-\d+-\d+)" hx-preserve( open)?>(.*?)</details>',
    re.S,
)


def test_the_incident_page_shows_stacks_escaped_and_collapses_long_ones(
    dash: DashboardApp, client: Browser
) -> None:
    seeded = seed_heavy_incident(dash)
    short = "Thread 7 (idle)\n    wait_for <b>peer</b> (dist.py:3)\n"
    long = "".join(f"    frame_{i} (m.py:{i})\n" for i in range(60))
    with dash.session() as s:
        record_stacks(
            s,
            incident_id=seeded.incident_id,
            action_id=1,
            node="node-1",
            actor="worker:w",
            now=utcnow(),
            captures=[
                {"role": "trainer", "rank": 0, "pid": 7, "ok": True, "text": short},
                {
                    "role": "rollout",
                    "rank": 1,
                    "pid": 8,
                    "ok": False,
                    "reason": "process gone: it exited (-9) before the capture",
                },
            ],
        )
        record_stacks(
            s,
            incident_id=seeded.incident_id,
            action_id=2,
            node="node-1",
            actor="worker:w",
            now=utcnow(),
            captures=[{"role": "trainer", "rank": 0, "pid": 9, "ok": True, "text": long}],
        )
        s.commit()
    login(client, "vera")
    html = client.get(f"/incidents/{seeded.incident_id}").text
    (short_id, short_open, short_html), (long_id, long_open, long_html) = STACKS.findall(html)
    assert short_open == " open" and long_open == ""  # 60 lines start collapsed
    assert "<pre>" in short_html
    assert "wait_for &lt;b&gt;peer&lt;/b&gt; (dist.py:3)" in short_html and "<b>peer" not in html
    assert "frame_59 (m.py:59)" in long_html and "61 lines" in long_html
    assert "No Python stacks" in html
    assert "process gone: it exited (-9) before the capture" in html
    live = client.get(
        f"/ui/incidents/{seeded.incident_id}/timeline", headers={"HX-Request": "true"}
    ).text
    # The live partial (htmx polling) renders the same blocks, under the same ids, which htmx
    # keeps as they are (hx-preserve): a dump the reader opened is not folded by the next poll.
    assert [m[0] for m in STACKS.findall(live)] == [short_id, long_id] and short_id != long_id
