"""The Silences page: the list with states, the create form and expire button for operators,
the list only for viewers, CSRF on both posts, the store's reasons on a bad form."""

from __future__ import annotations

import re

from sqlmodel import Session, select

from app.models import AuditEvent
from app.models.silence import Silence
from tests.harness.dashboard import Browser, DashboardApp, login


def silences(dash: DashboardApp) -> list[Silence]:
    with Session(dash.app.state.engine) as s:
        return list(s.exec(select(Silence)).all())


def test_operator_creates_and_expires_a_silence(client: Browser, dash: DashboardApp) -> None:
    csrf = login(client, "otto")
    page = client.get("/silences")
    assert page.status_code == 200 and 'data-testid="silence-form"' in page.text
    assert 'data-testid="no-silences"' in page.text
    made = client.post("/silences", data={
        "csrf_token": csrf, "matchers": "node=gpu-03, kind=~gpu_.*", "duration": "90m",
        "comment": "riser swap", "stops_actions": "true",
    })  # fmt: skip
    assert made.status_code == 200 and str(made.url).endswith("/silences")
    [row] = silences(dash)
    assert (row.author, row.comment, row.stops_actions) == ("user:otto", "riser swap", True)
    assert re.search(r'data-testid="state">active<', made.text)
    assert "node=gpu-03, kind=~gpu_.*" in made.text and "held" in made.text
    # htmx's expire: the table comes back, the row expired, its button gone.
    gone = client.post(f"/silences/{row.id}/expire", data={"csrf_token": csrf},
                       headers={"HX-Request": "true"})  # fmt: skip
    assert gone.status_code == 200 and gone.text.lstrip().startswith('<div id="silences-table"')
    assert re.search(r'data-testid="state">expired<', gone.text)
    assert f"/silences/{row.id}/expire" not in gone.text
    with Session(dash.app.state.engine) as s:
        actions = [a.action for a in s.exec(select(AuditEvent)).all()]
    assert actions.count("silence.create") == 1 and actions.count("silence.expire") == 1


def test_a_bad_form_is_refused_with_the_reason_and_nothing_is_stored(
    client: Browser, dash: DashboardApp
) -> None:
    csrf = login(client, "otto")
    for fields, reason in [
        ({"matchers": "", "duration": "1h"}, "at least one matcher"),
        ({"matchers": "host=n1", "duration": "1h"}, "unknown label &#39;host&#39;"),
        ({"matchers": "job=~(x", "duration": "1h"}, "bad regex"),
        ({"matchers": "job=~x(?=y)", "duration": "1h"}, "uses a lookahead (?=...)"),
        ({"matchers": "node=n1", "duration": "soon"}, "duration &#39;soon&#39;"),
        ({"matchers": "node=n1", "duration": "30d"}, "longer than the maximum"),
    ]:
        r = client.post("/silences", data={"csrf_token": csrf, "comment": "x", **fields})
        assert r.status_code == 422, fields
        assert reason in r.text, (fields, r.text[-2000:])
    assert silences(dash) == []


def test_viewer_sees_the_list_but_no_form_and_cannot_post(
    client: Browser, dash: DashboardApp
) -> None:
    csrf = login(client, "otto")
    client.post("/silences", data={"csrf_token": csrf, "matchers": "node=n1", "duration": "1h",
                                   "comment": "ops"})  # fmt: skip
    [row] = silences(dash)
    client.cookies.clear()
    csrf = login(client, "vera")
    page = client.get("/silences")
    assert page.status_code == 200 and f'data-testid="silence-{row.id}"' in page.text
    assert "silence-form" not in page.text and "/expire" not in page.text
    r = client.post("/silences", data={"csrf_token": csrf, "matchers": "node=n2",
                                       "duration": "1h", "comment": "x"})  # fmt: skip
    assert r.status_code == 403 and "needs the operator role" in r.text
    r = client.post(f"/silences/{row.id}/expire", data={"csrf_token": csrf})
    assert r.status_code == 403 and len(silences(dash)) == 1


def test_posts_without_csrf_are_refused(client: Browser, dash: DashboardApp) -> None:
    login(client, "otto")
    r = client.post("/silences", data={"matchers": "node=n1", "duration": "1h", "comment": "x"})
    assert r.status_code == 403 and silences(dash) == []
