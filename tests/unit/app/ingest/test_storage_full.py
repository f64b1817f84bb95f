"""The full-disk circuit of ingest (app.ingest.storage_full): which failures open it, with
the errors the drivers really raise, and how long it holds. The full disk itself, under SQLite
and PostgreSQL: tests/integration/ingest/test_ingest_storage_full.py."""

from __future__ import annotations

import errno
import os

import pytest
import sqlalchemy as sa

from app.ingest.storage_full import StorageFullCircuit, storage_full_cause


def test_a_full_disk_is_named_in_the_errors_each_database_raises() -> None:
    """The causes the committer is told, as the drivers really raise them."""
    engine = sa.create_engine("sqlite://")
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA max_page_count = 2")
        conn.exec_driver_sql("CREATE TABLE t (x BLOB)")
        with pytest.raises(sa.exc.OperationalError) as full:
            conn.exec_driver_sql("INSERT INTO t VALUES (zeroblob(100000))")
        with pytest.raises(sa.exc.OperationalError) as other:
            conn.exec_driver_sql("SELECT * FROM no_such_table")
    cause = storage_full_cause(full.value)
    assert cause is not None and cause.startswith("database disk is full (SQLITE_FULL")
    assert storage_full_cause(other.value) is None
    enospc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert storage_full_cause(enospc) == "database disk is full (ENOSPC: No space left on device)"
    assert storage_full_cause(OSError(errno.EIO, "I/O error")) is None


def test_other_commit_failures_keep_waiting_for_the_commit_timeout() -> None:
    """Only a full disk opens the circuit: a database that is merely down is retried."""
    now = [100.0]
    circuit = StorageFullCircuit(5.0, clock=lambda: now[0])
    assert not circuit.commit_failed(OSError(errno.ECONNREFUSED, "refused"))
    assert circuit.refusal() is None
    assert circuit.commit_failed(OSError(errno.ENOSPC, "No space left on device"))
    refusal = circuit.refusal()
    assert refusal is not None and "retry the same seq in 5 s" in str(refusal)
    now[0] += 5.0
    assert circuit.refusal() is None  # tried again after the hold
    assert circuit.commit_failed(OSError(errno.EDQUOT, "Disk quota exceeded"))
    circuit.commit_succeeded()
    assert circuit.refusal() is None
