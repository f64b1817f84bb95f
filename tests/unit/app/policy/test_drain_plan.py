"""drain_node: planned for gpu_xid only when the XID is one of detection.gpu.drain_xids (none
by default), and always behind an approval, though gpu_xid is a medium incident."""

from __future__ import annotations

import yaml

from app.policy.plans import ActionName
from app.policy.policy_file import DEFAULT_POLICY_PATH, Policy, default_policy, parse_policy
from app.policy.replay import replay
from app.policy.signals import FaultKind, Tier
from tests.policy_traces import make_traces


def _policy(drain_xids: list[int]) -> Policy:
    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["detection"]["gpu"]["drain_xids"] = drain_xids
    return parse_policy(data)


def _xid_incident(xid: int, policy: Policy):  # type: ignore[no-untyped-def]
    scenario = make_traces.gpu_event(
        "gpu_xid_critical_events_total", "gpu_xid", 1, 0, "n1", "0", xid=xid
    )
    sim, _expect, _ = scenario(0)
    [opened] = [d for d in replay(make_traces.simulate(sim), policy=policy).opened]
    assert opened.kind is FaultKind.GPU_XID and opened.tier is Tier.MEDIUM
    return opened


def test_xid_79_plans_an_approved_drain_of_its_node_when_configured() -> None:
    opened = _xid_incident(79, _policy([79, 48]))
    by_name = {a.action: a for a in opened.actions}
    drain = by_name[ActionName.DRAIN_NODE]
    assert drain.needs_approval and drain.node == "n1"
    assert drain.params == {"xid": 79, "gpu": opened.subject.gpu}
    assert not by_name[ActionName.RESCHEDULE_BATCHES].needs_approval  # the rest stays automatic


def test_no_drain_by_default_nor_for_an_xid_not_listed() -> None:
    assert default_policy().detection.gpu.drain_xids == ()
    # 48 (a double-bit ECC error: medium, its bucket's plan has drain_node) is not listed
    for xid, policy in ((79, default_policy()), (48, _policy([79]))):
        actions = {a.action for a in _xid_incident(xid, policy).actions}
        assert ActionName.DRAIN_NODE not in actions and ActionName.RESCHEDULE_BATCHES in actions
