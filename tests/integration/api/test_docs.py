"""/docs is Swagger UI from our own /static: no page of the public surface loads from elsewhere."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from tests.harness import Api

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

_REF = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", re.I)


def test_docs_page_uses_only_local_assets_under_a_strict_csp(
    hardened_api: Callable[..., Api],
) -> None:
    api = hardened_api()
    for page in ("/docs", "/login"):
        r = api.client.get(page)
        assert r.status_code == 200, page
        refs = _REF.findall(r.text)
        assert refs, page
        for ref in refs:
            if ref.startswith(("data:", "#")):
                continue  # an inline favicon or an anchor, not a fetch
            assert ref.startswith("/") and not ref.startswith("//"), f"{page} loads {ref}"
            if ref.startswith("/static/"):
                asset = api.client.get(ref)
                assert asset.status_code == 200 and asset.content, ref
        assert "cdn" not in r.text.lower(), page
    docs = api.client.get("/docs")
    csp = docs.headers["content-security-policy"]
    assert (
        "script-src 'self'" in csp
        and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    )
    assert "<script>" not in docs.text  # no inline script: it would need 'unsafe-inline'
    init = api.client.get("/static/js/swagger-init.js").text
    assert '"/openapi.json"' in init and "validatorUrl: null" in init
    assert api.client.get("/redoc").status_code == 404
    assert "/api/v1/ingest" in api.client.get("/openapi.json").json()["paths"]
