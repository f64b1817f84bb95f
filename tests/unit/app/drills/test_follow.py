"""Which incidents a drill's fault opened: its process's (same role, its rank or none) and the
job's own, never another process's or a machine's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.drills.follow import _caused_by
from app.models.drill import Drill
from app.models.incident import Incident


@pytest.mark.parametrize(
    ("subject", "caused"),
    [
        ({"job": "j", "role": "rollout", "rank": 1}, True),
        ({"job": "j", "role": "rollout", "rank": "1"}, True),
        ({"job": "j", "role": "rollout"}, True),
        ({"job": "j"}, True),
        ({"job": "j", "role": "rollout", "rank": 0}, False),
        ({"job": "j", "role": "trainer", "rank": 1}, False),
        ({"job": "j", "node": "n1"}, False),
        ({"node": "n1", "gpu": 0}, False),
    ],
)
def test_an_incident_is_the_drills_when_it_is_its_process_or_its_job(
    subject: dict[str, object], caused: bool
) -> None:
    drill = Drill(
        id=1,
        job="j",
        role="rollout",
        rank=1,
        node="n1",
        fault="kill",
        requested_by="user:op",
        requested_at=datetime.now(UTC),
    )
    inc = Incident(key="k", kind="heartbeat_lost", tier="medium", subject=subject, job="j")
    assert _caused_by(drill, inc) is caused
