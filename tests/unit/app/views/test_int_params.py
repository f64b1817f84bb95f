"""Dashboard pages with an integer beyond a signed 64-bit integer in the path or query (issue 17
item 7): the 422 error page naming the parameter (SQLite used to raise OverflowError, a 500);
the largest 64-bit id is an unknown one (the 404 page)."""

from __future__ import annotations

from tests.harness.dashboard import Browser, login

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
        assert "<html" in r.text.lower() and "Bad request" in r.text, (url, r.text[:300])
        reason = r.headers["X-RLGuard-Reason"]
        assert reason.startswith(f"{name}: ") and "9223372036854775807" in reason, (url, reason)
    for url in (f"/incidents/{BIG - 1}", f"/approvals/{BIG - 1}"):
        r = client.get(url)
        assert r.status_code == 404 and "<html" in r.text.lower(), (url, r.status_code)
    # The API keeps FastAPI's JSON answer for the same mistake.
    api = client.get(f"/api/v1/incidents/{BIG}")
    assert api.status_code in (401, 404, 422) and "<html" not in api.text.lower()
