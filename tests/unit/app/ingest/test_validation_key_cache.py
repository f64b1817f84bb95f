"""The validator's cache of known series is bounded per node: one node's new series in every
batch (a flood) empties only its own share, never another node's."""

from __future__ import annotations

import time

import orjson
import pytest

from app.core.config import IngestLimits
from app.ingest import validation
from app.ingest.validation import BatchValidator


def body(node: str, names: range) -> bytes:
    now = time.time()
    samples = [{"name": f"m{i}", "value": 1.0, "ts": now, "labels": {"gpu": "0"}} for i in names]
    return orjson.dumps(
        {"agent_id": "a", "node": node, "seq": 0, "sent_at": now, "samples": samples}
    )


def test_a_flooding_node_empties_only_its_own_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "_KEY_CACHE_LIMIT", 100)  # the whole cache's bound
    monkeypatch.setattr(validation, "_KEY_CACHE_LIMIT_PER_NODE", 50)
    v = BatchValidator(IngestLimits())
    v.validate(body("calm", range(10)))
    calm = dict(v._text_keys["calm"])  # noqa: SLF001 - what the typed path looks series up in
    for start in range(0, 500, 40):
        v.validate(body("flood", range(start, start + 40)))
    assert v._text_keys["calm"] == calm  # noqa: SLF001
    assert len(v._keys.get("flood", {})) <= 50 + 40  # noqa: SLF001 - the limit and one batch
