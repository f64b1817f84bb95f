"""Fault descriptions for the simulated NVML: what is accepted, and errors that name the value."""

from __future__ import annotations

import pytest

from agents.fake_nvml import FakeNVML
from agents.simulate import FaultSpecError, apply_fault


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ([], "[]"),
        ({"fault": "meltdown", "gpu": 0}, "'meltdown'"),
        ({"fault": "xid", "gpu": 9, "xid": 79}, "9"),
        ({"fault": "xid", "gpu": "0", "xid": 79}, "'0'"),
        ({"fault": "xid", "gpu": 0}, "'xid'"),
        ({"fault": "xid", "gpu": 0, "xid": 0}, "0"),
        ({"fault": "thermal", "gpu": 0, "on": "yes"}, "'yes'"),
        ({"fault": "ecc_uncorrectable", "gpu": 0, "count": -1}, "-1"),
    ],
)
def test_bad_fault_is_refused_and_changes_nothing(doc: object, needle: str) -> None:
    fake = FakeNVML(2)
    before = [(g.lost, g.throttle_reasons, g.ecc_uncorrected, list(g.events)) for g in fake.gpus]
    with pytest.raises(FaultSpecError) as info:
        apply_fault(fake, doc)
    assert needle in str(info.value)
    assert [
        (g.lost, g.throttle_reasons, g.ecc_uncorrected, list(g.events)) for g in fake.gpus
    ] == before


def test_each_fault_kind() -> None:
    fake = FakeNVML(2)
    assert "XID 63" in apply_fault(fake, {"fault": "xid", "gpu": 0, "xid": 63})
    apply_fault(fake, {"fault": "ecc_uncorrectable", "gpu": 1, "count": 3})
    assert fake.gpus[1].ecc_uncorrected == 3
    apply_fault(fake, {"fault": "thermal", "gpu": 1})
    assert fake.gpus[1].throttle_reasons
    apply_fault(fake, {"fault": "thermal", "gpu": 1, "on": False})
    assert not fake.gpus[1].throttle_reasons
    apply_fault(fake, {"fault": "gpu_lost", "gpu": 0})
    assert fake.gpus[0].lost
    apply_fault(fake, {"fault": "gpu_restore", "gpu": 0})
    assert not fake.gpus[0].lost
