"""``rlguard_incidents_open{kind, tier}``: open incidents counted in the database (SQLite and
PostgreSQL) and exported by ``IncidentCollector``, recomputed at most once a refresh."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from sqlmodel import Session

from app.core import migrate
from app.core.db import make_engine
from app.incidents.queries import open_incident_counts, open_incident_counts_source
from app.metrics import IncidentCollector
from app.models.incident import Incident, IncidentStatus


def _incident(n: int, kind: str, tier: str, *, open_: bool = True) -> Incident:
    key = f"{kind}/job-{n}"
    status = IncidentStatus.open if open_ else IncidentStatus.resolved
    return Incident(
        key=key,
        open_key=key if open_ else None,
        kind=kind,
        tier=tier,
        status=status.value,
        subject={"job": f"job-{n}"},
        job=f"job-{n}",
    )


def test_open_incidents_are_counted_by_kind_and_tier(database_url: str) -> None:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    try:
        assert open_incident_counts_source(engine)() == []
        with Session(engine) as s:
            s.add_all(
                [
                    _incident(1, "train_hang", "medium"),
                    _incident(2, "train_hang", "medium"),
                    _incident(3, "train_hang", "heavy"),  # escalated: its own tier
                    _incident(4, "train_hang", "medium", open_=False),  # resolved: not counted
                    _incident(5, "gpu_xid", "medium"),
                ]
            )
            s.commit()
            assert open_incident_counts(s) == [
                ("gpu_xid", "medium", 1),
                ("train_hang", "heavy", 1),
                ("train_hang", "medium", 2),
            ]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(IncidentCollector(open_incident_counts_source(engine)))
        text = generate_latest(registry).decode()
        assert "# TYPE rlguard_incidents_open gauge" in text
        assert 'rlguard_incidents_open{kind="train_hang",tier="medium"} 2.0' in text
        assert 'rlguard_incidents_open{kind="train_hang",tier="heavy"} 1.0' in text
        assert 'rlguard_incidents_open{kind="gpu_xid",tier="medium"} 1.0' in text
    finally:
        engine.dispose()


def test_reuses_the_last_counts_within_the_refresh_and_keeps_them_on_failure() -> None:
    calls: list[int] = []
    clock = [100.0]

    def compute() -> list[tuple[str, str, int]]:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("database away")
        return [("train_hang", "medium", len(calls))]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(IncidentCollector(compute, refresh_seconds=15, clock=lambda: clock[0]))
    assert 'kind="train_hang",tier="medium"} 1.0' in generate_latest(registry).decode()
    generate_latest(registry)
    assert len(calls) == 1  # within the refresh: no new query
    clock[0] += 16
    assert 'kind="train_hang",tier="medium"} 1.0' in generate_latest(registry).decode()  # kept
    clock[0] += 16
    assert 'kind="train_hang",tier="medium"} 3.0' in generate_latest(registry).decode()
