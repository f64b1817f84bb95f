"""Environment drift between the nodes of one job."""

from __future__ import annotations

import pytest

from app.policy.detectors import EnvDriftDetector
from app.policy.signals import FaultKind

from .._helpers import Cluster

pytestmark = pytest.mark.timeout(30)


def test_env_drift_names_the_differing_keys() -> None:
    c = Cluster()
    det = EnvDriftDetector(c.policy)
    c.participant("trainer", 0, "n0")
    c.participant("rollout", 0, "n1")
    c.fingerprints = {
        "n0": {"torch": "2.4.1", "cuda": "12.4", "hostname": "a"},
        "n1": {"torch": "2.4.1", "cuda": "12.4", "hostname": "b"},
    }
    assert det.detect(c.world()) == []  # hostname is ignored
    c.fingerprints["n1"]["torch"] = "2.3.0"
    [sig] = det.detect(c.world())
    assert sig.kind is FaultKind.ENV_DRIFT and sig.extra["differing_keys"] == ["torch"]
    assert "torch=2.3.0" in sig.evidence.detail
