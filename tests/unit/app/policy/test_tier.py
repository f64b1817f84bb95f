"""The one Tier: ordered by severity, for the policy and for alerts alike."""

from __future__ import annotations

import pytest

from app.alerts.grouping import AlertBatch
from app.policy.signals import Tier
from tests.unit.app.alerts._factories import event


def test_tiers_order_by_severity_not_by_name() -> None:
    assert sorted([Tier.HEAVY, Tier.LIGHT, Tier.MEDIUM]) == [Tier.LIGHT, Tier.MEDIUM, Tier.HEAVY]
    assert Tier.LIGHT < Tier.MEDIUM < Tier.HEAVY and Tier.HEAVY >= Tier.HEAVY
    assert max([Tier.MEDIUM, Tier.HEAVY, Tier.LIGHT]) is Tier.HEAVY
    assert [t.rank for t in Tier] == [0, 1, 2]


def test_a_tier_does_not_compare_with_a_plain_string() -> None:
    with pytest.raises(TypeError, match="compares only with a Tier"):
        assert Tier.HEAVY > "light"
    assert Tier.HEAVY == "heavy" and Tier("medium") is Tier.MEDIUM


def test_alerts_use_the_policy_tier() -> None:
    # An alert built from an incident's stored tier gets the policy's own member, in order.
    alert = event(tier="heavy")
    assert alert.tier is Tier.HEAVY
    assert AlertBatch((event(tier="light"), alert, event(tier="medium"))).tier is Tier.HEAVY
