"""What an operator's policy file does not say: the shipped rule for each fault kind or XID
bucket it does not name.

Why: a policy file written for an earlier release does not know the fault kinds added since;
refusing it would stop the server on upgrade, and a kind with no rule would go undetected. The
shipped rule is what a fresh install does; a warning names each key taken so the operator can
write their own.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import yaml

DEFAULT_POLICY_PATH = Path(__file__).with_name("policy.yaml")

log = logging.getLogger("rlguard.policy")

# Sections keyed by a closed vocabulary that grows between releases (a new fault kind, a new XID
# bucket): an operator's file written before the new key existed takes the shipped rule for it.
_PER_KEY_SECTIONS = ("tiers", "xid_buckets")


@functools.cache
def _shipped_data() -> dict[str, Any]:
    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text(encoding="utf-8"))
    assert isinstance(data, dict), DEFAULT_POLICY_PATH
    return data


def with_shipped_rules(data: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """``data`` with the shipped rule for each fault kind or XID bucket its ``tiers`` or
    ``xid_buckets`` do not name, and the keys so taken (``tiers.<kind>``), each named in a
    warning. A section that is absent or not a mapping is left for validation to report."""
    shipped = _shipped_data()
    merged = dict(data)
    taken: list[str] = []
    for section in _PER_KEY_SECTIONS:
        own = data.get(section)
        if not isinstance(own, dict):
            continue
        missing = [key for key in shipped[section] if key not in own]
        if missing:
            merged[section] = {**own, **{key: shipped[section][key] for key in missing}}
            taken += [f"{section}.{key}" for key in missing]
    if taken:
        log.warning(
            "policy file %s has no rule for %s: using the shipped policy's",
            source,
            ", ".join(taken),
        )
    return merged, taken
