"""The XID catalog: each XID is judged by NVIDIA's resolution bucket for its code (tier and plan
per bucket in policy.yaml); a code the catalog does not list is light with the code shown;
ignored buckets open nothing; agents without per-code counters still work (critical counter)."""

from __future__ import annotations

import pytest
import yaml

from app.policy.detectors import GpuHealthDetector
from app.policy.engine import PolicyEngine
from app.policy.plans import ActionName
from app.policy.policy_file import (
    DEFAULT_POLICY_PATH,
    PolicyFileError,
    default_policy,
    parse_policy,
)
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from app.policy.xid_catalog import XID_CATALOG, XidBucket, bucket_of, entry_of
from recovery.protocol import metric_names as m

from ._helpers import Cluster

pytestmark = pytest.mark.timeout(30)

RESCHEDULE_AND_DRAIN = (ActionName.RESCHEDULE_BATCHES, ActionName.DRAIN_NODE)

# (bucket, a code NVIDIA puts in it, the tier and plan the shipped policy gives it)
BUCKETS = [
    (XidBucket.RESTART_APP, 13, Tier.LIGHT, ()),
    (XidBucket.RESTART_APP, 31, Tier.LIGHT, ()),
    (XidBucket.RESTART_APP, 94, Tier.LIGHT, ()),
    (XidBucket.RESET_GPU, 95, Tier.MEDIUM, RESCHEDULE_AND_DRAIN),
    (XidBucket.RESET_GPU, 119, Tier.MEDIUM, RESCHEDULE_AND_DRAIN),
    (XidBucket.RESET_GPU, 64, Tier.MEDIUM, RESCHEDULE_AND_DRAIN),
    (XidBucket.RESTART_BM, 79, Tier.MEDIUM, RESCHEDULE_AND_DRAIN),
    (XidBucket.RESTART_VM, 151, Tier.MEDIUM, RESCHEDULE_AND_DRAIN),
    (XidBucket.CONTACT_SUPPORT, 61, Tier.MEDIUM, RESCHEDULE_AND_DRAIN),
    (XidBucket.WORKFLOW_XID_48, 48, Tier.MEDIUM, RESCHEDULE_AND_DRAIN),
    (XidBucket.WORKFLOW_NVLINK_ERR, 74, Tier.MEDIUM, RESCHEDULE_AND_DRAIN),
    (XidBucket.WORKFLOW_NVLINK5_ERR, 145, Tier.MEDIUM, RESCHEDULE_AND_DRAIN),
    (XidBucket.CHECK_MECHANICALS, 54, Tier.LIGHT, ()),
    (XidBucket.UPDATE_SWFW, 78, Tier.LIGHT, ()),
    (XidBucket.CHECK_UVM, 159, Tier.LIGHT, ()),
    (XidBucket.IGNORE, 63, Tier.LIGHT, ()),
    (XidBucket.WORKFLOW_XID_45, 45, Tier.LIGHT, ()),
    (XidBucket.UNKNOWN, 999, Tier.LIGHT, ()),
]


def test_the_catalog_covers_the_common_xids_with_their_buckets() -> None:
    common = {13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 140}
    assert common <= set(XID_CATALOG)
    assert {code: bucket_of(code).value for code in (43, 62, 68, 69, 92, 120, 140)} == {
        43: "IGNORE",
        62: "RESET_GPU",
        68: "RESTART_APP",
        69: "RESTART_APP",
        92: "IGNORE",
        120: "RESET_GPU",
        140: "RESET_GPU",
    }
    assert entry_of(79).mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert bucket_of(154) is XidBucket.UNKNOWN  # NVIDIA: "as it applies to another Xid"
    assert all(e.bucket is not XidBucket.UNKNOWN for e in XID_CATALOG.values())


@pytest.mark.parametrize(("bucket", "code", "tier", "plan"), BUCKETS)
def test_each_bucket_gives_its_tier_and_plan(
    bucket: XidBucket, code: int, tier: Tier, plan: tuple[ActionName, ...]
) -> None:
    assert bucket_of(code) is bucket
    sig = FaultSignal(
        kind=FaultKind.GPU_XID,
        subject=_subject(),
        evidence=_evidence(),
        suggested_tier=Tier.LIGHT,
        detected_at=0.0,
        extra={"xid": code},
    )
    rule = default_policy().rule_for(sig)
    assert (rule.tier, rule.plan) == (tier, plan)


def test_an_xid_with_no_code_keeps_the_gpu_xid_rule() -> None:
    sig = FaultSignal(
        kind=FaultKind.GPU_XID,
        subject=_subject(),
        evidence=_evidence(),
        suggested_tier=Tier.LIGHT,
        detected_at=0.0,
    )
    policy = default_policy()
    assert policy.rule_for(sig) == policy.tier_rule(FaultKind.GPU_XID)


def test_a_policy_missing_a_bucket_does_not_load() -> None:
    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    del data["xid_buckets"]["RESET_GPU"]
    with pytest.raises(PolicyFileError, match="no rule for bucket.s. RESET_GPU"):
        parse_policy(data)
    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["detection"]["gpu"]["ignore_xid_buckets"] = ["NOT_A_BUCKET"]
    with pytest.raises(PolicyFileError, match="detection.gpu.ignore_xid_buckets.0"):
        parse_policy(data)


# -- the detector, fed per-code counters as the agent sends them ------------------------------


def _xid_run(code: int) -> list[list[FaultSignal]]:
    c = Cluster()
    det = GpuHealthDetector(c.policy)
    c.run(5, lambda c: c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 0, gpu="0"), detector=det)

    def xid(c: Cluster) -> None:
        c.put("n1", m.GPU_XID_EVENTS_TOTAL, 1, gpu="0", xid=str(code))
        c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 1, gpu="0")  # the agent's critical count
        c.put("n1", m.GPU_XID_LAST_CODE, code, gpu="0")

    return c.run(3, xid, detector=det)


def test_an_unknown_xid_is_light_with_its_raw_code_in_the_evidence() -> None:
    [[sig], *_] = _xid_run(999)
    assert sig.kind is FaultKind.GPU_XID and sig.suggested_tier is Tier.LIGHT
    assert sig.extra["xid"] == 999 and sig.extra["xid_bucket"] == "UNKNOWN"
    assert "XID 999" in sig.evidence.detail and "UNKNOWN" in sig.evidence.detail


def test_a_known_xid_names_its_mnemonic_and_bucket_and_counts_once() -> None:
    [[sig], *_] = _xid_run(95)  # one signal although two counters rose (per code, critical)
    assert sig.suggested_tier is Tier.MEDIUM and sig.extra["xids"] == [95]
    assert "ROBUST_CHANNEL_UNCONTAINED_ERROR" in sig.evidence.detail
    assert "RESET_GPU" in sig.evidence.detail


def test_ignored_buckets_open_nothing() -> None:
    for code in (45, 63, 92):
        assert all(res == [] for res in _xid_run(code)), code


def test_several_codes_on_one_gpu_are_one_signal_named_for_the_worst() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)
    c.run(5, lambda c: c.put("n1", m.GPU_LOST, 0, gpu="0"), detector=det)

    def xids(c: Cluster) -> None:
        c.put("n1", m.GPU_XID_EVENTS_TOTAL, 1, gpu="0", xid="13")
        c.put("n1", m.GPU_XID_EVENTS_TOTAL, 1, gpu="0", xid="48")

    [[sig], *_] = c.run(2, xids, detector=det)
    assert sig.extra["xid"] == 48 and sig.extra["xids"] == [13, 48]
    assert sig.suggested_tier is Tier.MEDIUM


def test_an_older_agent_without_per_code_counters_is_judged_by_its_newest_code() -> None:
    policy = default_policy()
    for code, tier in ((79, Tier.MEDIUM), (13, Tier.LIGHT)):
        c = Cluster(policy)
        e = PolicyEngine(policy)
        c.run(5, lambda c: c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 0, gpu="0"), engine=e)

        def xid(c: Cluster, code: int = code) -> None:
            c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 1, gpu="0")
            c.put("n1", m.GPU_XID_LAST_CODE, code, gpu="0")

        [opened] = c.run(2, xid, engine=e)
        assert opened.kind is FaultKind.GPU_XID and opened.tier is tier, code
        assert opened.signal is not None and opened.signal.extra["xid_bucket"] == bucket_of(code)


def _subject() -> Subject:
    return Subject(node="n1", gpu="0")


def _evidence() -> Evidence:
    return Evidence(metric=None)
