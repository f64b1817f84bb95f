"""One rule for the audit log on the API and the page (issue 17 item 5), phone numbers masked
for non-admins (item 12), on a real app."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.alerts.config import parse_alerts_config
from app.models import Role
from tests.harness import Api, auth
from tests.integration.auth._browser import Browser, add_user

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MOBILE = "13800138000"


@pytest.fixture
def auth_db_url(sqlite_url: str) -> str:
    return sqlite_url


def test_audit_log_is_for_admins_on_the_api_and_the_page_alike(
    make_replica: Callable[..., Api],
) -> None:
    api = make_replica()
    seen: dict[str, tuple[int, int, bool]] = {}
    for role in Role:
        token = add_user(api, f"u-{role.value}", role)
        browser = Browser(api)
        assert browser.login(f"u-{role.value}").status_code == 303
        page = browser.get("/audit")
        home = browser.get("/")
        seen[role.value] = (
            api.client.get("/api/v1/audit", headers=auth(token)).status_code,
            page.status_code,
            'href="/audit"' in home.text,
        )
        if page.status_code == 403:
            assert "audit log needs the admin role" in page.text
    assert seen == {
        "viewer": (403, 403, False),
        "operator": (403, 403, False),
        "approver": (403, 403, False),
        "admin": (200, 200, True),
    }


def test_wecom_phone_numbers_are_masked_for_everyone_but_admins(
    make_replica: Callable[..., Api],
) -> None:
    api = make_replica()
    api.app.state.alerts_config = parse_alerts_config(
        {
            "external_base_url": "http://127.0.0.1:8000",
            "channels": [
                {
                    "type": "wecom",
                    "name": "oncall",
                    "url": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k" + "0" * 30,
                    "mentioned_mobile_list": [MOBILE, "@all"],
                }
            ],
        }
    )
    shown = {}
    for role in Role:
        token = add_user(api, f"u-{role.value}", role)
        r = api.client.get("/api/v1/alerts/channels", headers=auth(token))
        assert r.status_code == 200, r.text
        shown[role.value] = r.json()["channels"][0]["mentioned_mobile_list"]
    masked = ["*******8000", "@all"]
    assert shown == {
        "viewer": masked,
        "operator": masked,
        "approver": masked,
        "admin": [MOBILE, "@all"],
    }
