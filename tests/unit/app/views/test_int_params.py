"""Dashboard pages with an integer beyond a signed 64-bit integer in the path or query (issue 17
item 7): 422 naming the parameter (SQLite used to raise OverflowError, a 500); the largest
64-bit id is an unknown one (the 404 page)."""

from __future__ import annotations

from tests.unit.app.views.conftest import Browser, login

BIG = 2**63
PAGES = [
    ("GET", f"/incidents/{BIG}", "incident_id"),
    ("GET", f"/ui/incidents/{BIG}/timeline", "incident_id"),
    ("GET", f"/approvals/{BIG}", "approval_id"),
    ("POST", f"/approvals/{BIG}/approve", "approval_id"),
    ("POST", f"/approvals/{BIG}/reject", "approval_id"),
    ("GET", f"/alerts?incident={BIG}", "incident"),
    ("GET", f"/alerts?before={BIG}", "before"),
    ("GET", f"/audit?before={BIG}", "before"),
]


def test_pages_refuse_integers_beyond_64_bits_by_name(client: Browser) -> None:
    csrf = login(client, "adam")
    for method, url, name in PAGES:
        data = {"csrf_token": csrf, "comment": "x"} if method == "POST" else None
        r = client.request(method, url, data=data)
        assert r.status_code == 422, (url, r.status_code, r.text[:300])
        assert r.json()["detail"][0]["loc"][-1] == name, (url, r.text[:300])
    for url in (f"/incidents/{BIG - 1}", f"/approvals/{BIG - 1}"):
        r = client.get(url)
        assert r.status_code == 404 and "<html" in r.text.lower(), (url, r.status_code)
