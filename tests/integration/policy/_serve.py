"""Test server entry: the real app with the policy scheduler and the policy routes.

Until ``app.main`` registers them itself this adds them (each only if missing), so the tests
exercise exactly the production objects. Run: python -m tests.integration.policy._serve HOST PORT
"""

from __future__ import annotations

import sys

import uvicorn


def factory():  # type: ignore[no-untyped-def]
    from app.api.routes import alertmanager, approvals, incidents
    from app.core.config import get_settings
    from app.main import EXTRA_LIFESPANS, create_app
    from app.services.scheduler import policy_lifespan

    hooks = list(EXTRA_LIFESPANS)
    if policy_lifespan not in hooks:
        hooks.append(policy_lifespan)
    app = create_app(get_settings(), extra_lifespans=hooks)
    paths = {getattr(r, "path", "") for r in app.routes}
    for module, path in ((incidents, "/api/v1/incidents"), (approvals, "/api/v1/approvals"),
                         (alertmanager, "/api/v1/alertmanager")):
        if path not in paths:
            app.include_router(module.router)
    return app


if __name__ == "__main__":
    uvicorn.run(factory, factory=True, host=sys.argv[1], port=int(sys.argv[2]), log_level="warning")
