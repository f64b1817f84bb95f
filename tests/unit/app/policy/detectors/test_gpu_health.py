"""GPU health: XIDs, ECC counters (baseline, reset), throttling, row remap, GPU lost."""

from __future__ import annotations

import pytest

from app.policy.detectors import GpuHealthDetector
from app.policy.signals import FaultKind
from recovery.protocol import metric_names as m

from .._helpers import Cluster, first_firing

pytestmark = pytest.mark.timeout(30)


# -- GPU health -------------------------------------------------------------------------------


def test_new_critical_xid_fires_with_code_and_holds_then_clears() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)
    c.run(10, lambda c: c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 0, gpu="0"), detector=det)

    def xid(c: Cluster) -> None:
        c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 1, gpu="0")
        c.put("n1", m.GPU_XID_LAST_CODE, 79, gpu="0")

    res = c.run(1, xid, detector=det)
    assert res[0][0].kind is FaultKind.GPU_XID and res[0][0].extra["xid"] == 79
    res = c.run(130, xid, detector=det)
    assert res[100] and res[-1] == []  # held for event_hold_seconds, then gone


def test_counters_already_nonzero_at_start_are_a_baseline() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)
    res = c.run(30, lambda c: c.put("n0", m.GPU_ECC_UNCORRECTED_TOTAL, 7, gpu="1"), detector=det)
    assert first_firing(res) is None
    res = c.run(1, lambda c: c.put("n0", m.GPU_ECC_UNCORRECTED_TOTAL, 8, gpu="1"), detector=det)
    assert res[0][0].kind is FaultKind.GPU_ECC_UNCORRECTABLE


def test_counter_reset_after_agent_restart_is_not_an_event() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)
    c.run(10, lambda c: c.put("n0", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 3, gpu="0"), detector=det)
    res = c.run(
        10, lambda c: c.put("n0", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 0, gpu="0"), detector=det
    )
    assert first_firing(res) is None


def test_throttling_must_be_sustained() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)
    c.run(5, lambda c: c.put("n1", m.GPU_THROTTLE_THERMAL, 0, gpu="1"), detector=det)
    res = c.run(50, lambda c: c.put("n1", m.GPU_THROTTLE_THERMAL, 1, gpu="1"), detector=det)
    assert first_firing(res) is None
    res = c.run(15, lambda c: c.put("n1", m.GPU_THROTTLE_THERMAL, 1, gpu="1"), detector=det)
    assert res[-1][0].kind is FaultKind.GPU_THROTTLED


def test_row_remap_failure_and_gpu_lost() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)

    def second(c: Cluster) -> None:
        c.put("n2", m.GPU_REMAPPED_ROWS_FAILURE, 1, gpu="0")
        c.put("n2", m.GPU_LOST, 1, gpu="1")

    res = c.run(1, second, detector=det)
    assert sorted(s.kind.value for s in res[0]) == ["gpu_lost", "gpu_row_remap_failure"]
    assert {s.subject.gpu for s in res[0]} == {"0", "1"}
