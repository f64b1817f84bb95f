"""The foundation's server fixtures, reused for the dashboard's ingest-side tests."""

from __future__ import annotations

from tests.integration.foundation.conftest import make_api, migrated_url, server_factory

__all__ = ["make_api", "migrated_url", "server_factory"]
