"""``/docs``: Swagger UI served from our own ``/static`` (FastAPI's default loads it from a CDN).

ReDoc is not offered (it would need another vendored bundle); ``/openapi.json`` is the contract.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)

SWAGGER_UI_VERSION = "5.35.0"

_PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>RLGuard API</title>
<link rel="stylesheet" href="/static/vendor/swagger-ui-{SWAGGER_UI_VERSION}.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/static/vendor/swagger-ui-bundle-{SWAGGER_UI_VERSION}.js"></script>
<script src="/static/js/swagger-init.js"></script>
</body>
</html>
"""

# Swagger UI sets inline styles and shows data: images; scripts only from this site.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui() -> HTMLResponse:
    return HTMLResponse(_PAGE, headers={"Content-Security-Policy": _CSP})
