"""A drill's values checked before the database is asked: each refusal names the value."""

from __future__ import annotations

import pytest

from app.core.errors import InvalidInput
from app.drills.public import DrillCreate
from app.drills.rules import check_values


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (dict(fault="melt"), "fault 'melt' is not one of kill, hang, oom, disk-full"),
        (dict(job="../etc"), "job '../etc' is not a job name"),
        (dict(job="x" * 129), "is not a job name"),
        (dict(role="a-b"), "role 'a-b' must be 1-64 of letters"),
        (dict(rank=-1), "rank -1 must be between 0 and"),
        (dict(at_step=2**31), f"at_step {2**31} must be between 0 and"),
    ],
)
def test_a_bad_value_is_refused_by_name(body: dict[str, object], message: str) -> None:
    full: dict[str, object] = {"job": "j", "fault": "kill", "role": "trainer", **body}
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_values(DrillCreate(**full))  # type: ignore[arg-type]


def test_good_values_pass() -> None:
    check_values(DrillCreate(job="grpo-7b", fault="disk-full", role="trainer", rank=3, at_step=0))


def test_a_process_with_an_open_incident_is_not_drilled() -> None:
    from sqlmodel import Session, SQLModel, create_engine

    import app.models.drill  # noqa: F401
    import app.models.incident  # noqa: F401
    from app.drills.rules import _open_incident_of
    from app.models.incident import Incident

    engine = create_engine("sqlite://")
    SQLModel.metadata.create_all(engine)
    with Session(engine) as s:
        s.add(
            Incident(
                key="a",
                kind="heartbeat_lost",
                tier="medium",
                job="j",
                subject={"job": "j", "role": "rollout", "rank": 1},
            )
        )
        s.add(
            Incident(
                key="b",
                kind="heartbeat_lost",
                tier="medium",
                job="j",
                status="resolved",
                subject={"job": "j", "role": "trainer", "rank": 0},
            )
        )
        s.commit()
        assert _open_incident_of(s, "j", "rollout", 1) == 1
        assert _open_incident_of(s, "j", "rollout", 0) is None
        assert _open_incident_of(s, "j", "trainer", 0) is None  # resolved
        assert _open_incident_of(s, "other", "rollout", 1) is None
