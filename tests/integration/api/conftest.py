"""The REST API on an in-process app (the foundation's fixtures, SQLite and PostgreSQL)."""

from tests.integration.foundation.conftest import api, make_api, migrated_url  # noqa: F401
