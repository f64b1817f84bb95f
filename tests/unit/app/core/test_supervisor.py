from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from app.core.config import Settings
from app.core.supervisor import EMBEDDED_CHILDREN, ChildSpec, ChildSupervisor, embedded_children


@pytest.mark.timeout(60)
def test_a_dying_child_is_restarted_and_all_are_stopped(tmp_path: Path) -> None:
    marker = tmp_path / "starts"
    crasher = ChildSpec(
        "crasher",
        [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x'); raise SystemExit(3)"],
    )
    sleeper = ChildSpec("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    sup = ChildSupervisor([crasher, sleeper], poll_interval=0.1)
    sup.start()
    try:
        deadline = time.monotonic() + 20
        while not marker.exists() or len(marker.read_text()) < 2:
            assert time.monotonic() < deadline, "crashed child was not restarted"
            time.sleep(0.1)
    finally:
        sup.stop(timeout=10)
    procs = sup._procs
    assert all(p.poll() is not None for p in procs.values())
    assert procs["sleeper"].returncode != 0  # terminated by us, not finished by itself


def test_embedded_children_come_from_registered_factories(tmp_path: Path) -> None:
    spec = ChildSpec("demo", ["true"])

    def factory(settings: Settings) -> ChildSpec | None:
        return spec if settings.redis_url else None

    EMBEDDED_CHILDREN.append(factory)
    try:
        with_redis = embedded_children(Settings(data_dir=tmp_path, redis_url="redis://x"))
        without = embedded_children(Settings(data_dir=tmp_path))
        assert spec in with_redis
        assert spec not in without
    finally:
        EMBEDDED_CHILDREN.remove(factory)
