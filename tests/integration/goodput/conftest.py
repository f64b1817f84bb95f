"""The foundation's in-process server fixtures (real app, real SQLite and PostgreSQL)."""

from __future__ import annotations

from tests.integration.foundation.conftest import api, make_api, migrated_url

__all__ = ["api", "make_api", "migrated_url"]
