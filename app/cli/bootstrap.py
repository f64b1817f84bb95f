"""First-run setup for ``rlguard up``: data directory, generated secret, first admin user."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.auth.users import any_admin, create_user
from app.core.config import DEFAULT_SECRET_KEY, Settings
from app.models import Role

ADMIN_CREDENTIALS_FILE = "initial-admin-credentials.txt"


def _write_private(path: Path, text: str) -> None:
    """Create ``path`` readable only by the owner (never briefly world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def ensure_data_dir(settings: Settings) -> Path:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return settings.data_dir


def ensure_secret(settings: Settings) -> bool:
    """Generate ``<data_dir>/secret_key`` unless a secret is configured or already kept.

    Returns True when a new secret was written. The caller must reload settings afterwards.
    """
    if settings.secret_key != DEFAULT_SECRET_KEY or settings.secret_file.exists():
        return False
    _write_private(settings.secret_file, secrets.token_urlsafe(48) + "\n")
    return True


@dataclass
class FirstAdmin:
    name: str
    credentials_file: Path


def ensure_first_admin(settings: Settings, engine: Engine) -> FirstAdmin | None:
    """Create user ``admin`` with a random password if there is no admin yet.

    The password and an API token go to a 0600 file in the data directory, never to stdout.
    """
    with Session(engine) as session:
        if any_admin(session):
            return None
        password = secrets.token_urlsafe(18)
        user, token = create_user(
            session, name="admin", role=Role.admin, password=password, actor="system:up"
        )
        path = settings.data_dir / ADMIN_CREDENTIALS_FILE
        if path.exists():
            path.unlink()  # stale file from a database that was since replaced
        _write_private(
            path,
            f"user: {user.name}\npassword: {password}\napi_token: {token}\n"
            "# Delete this file once you have stored these somewhere safe.\n",
        )
        session.commit()
    return FirstAdmin(name="admin", credentials_file=path)
