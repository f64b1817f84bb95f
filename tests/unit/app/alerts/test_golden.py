"""Rendered messages compared with the checked-in golden files under tests/alerts_golden/.

The golden files are what a reviewer reads to see what a phone shows. After an intended change,
regenerate them with `RLGUARD_REGEN_GOLDEN=1 .venv/bin/pytest tests/unit/app/alerts/test_golden.py`
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.alerts.grouping import AlertBatch
from app.alerts.message import RenderedMessage
from app.alerts.render import render_batch
from app.alerts.webhook import signature_headers
from app.policy.signals import Tier
from tests.unit.app.alerts._factories import WEBHOOK_SIGNING, config, decided, event, tier_scenario

GOLDEN = Path(__file__).resolve().parents[4] / "tests" / "alerts_golden"
REGENERATE = os.environ.get("RLGUARD_REGEN_GOLDEN") == "1"
# A fixed send time so the webhook's signature header is reproducible in the golden file.
SIGNED_AT = 1_795_000_000


def _cases() -> list[tuple[str, str, str, AlertBatch]]:
    cases = []
    for tier in Tier:
        batch = AlertBatch(tuple(tier_scenario(tier)))
        for channel in ("slack", "wecom", "webhook"):
            cases.append((f"{channel}_{tier.value}", channel, "en", batch))
    heavy = AlertBatch(tuple(tier_scenario(Tier.HEAVY)))
    cases.append(("slack_heavy_zh", "slack", "zh", heavy))
    cases.append(("wecom_heavy_zh", "wecom", "zh", heavy))
    cases.append(("wecom_decided_zh", "wecom", "zh", AlertBatch((decided(),))))
    resolved = event(
        event_id="e9",
        kind="resolved",
        tier="heavy",
        fault_kind="nodes_lost",
        occurred_at=decided().occurred_at.replace(minute=12),
    )
    cases.append(("slack_resolved", "slack", "en", AlertBatch((resolved,))))
    return cases


CHANNEL_NAMES = {"slack": "ops-slack", "wecom": "ops-wecom", "webhook": "pager"}


def _render(channel_type: str, locale: str, batch: AlertBatch) -> RenderedMessage:
    cfg = config()
    channel = cfg.channel(CHANNEL_NAMES[channel_type]).model_copy(update={"locale": locale})
    return render_batch(batch, channel=channel, config=cfg)


def _document(message: RenderedMessage) -> str:
    doc: dict[str, object] = {"posts": list(message.parts)}
    if message.channel_type == "webhook":
        from app.alerts.message import encode_body

        doc["headers_when_sent_at"] = {
            "sent_at": SIGNED_AT,
            "signing_secret": "the test secret from tests/unit/app/alerts/_factories.py",
            "headers": signature_headers(
                WEBHOOK_SIGNING, body=encode_body(message.parts[0]), now=SIGNED_AT
            ),
        }
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def _markdown_preview(message: RenderedMessage) -> str | None:
    if message.channel_type != "wecom":
        return None
    texts = [message.parts[0]["markdown"]["content"]]
    for part in message.parts[1:]:
        mentions = ", ".join(part["text"]["mentioned_mobile_list"])
        texts.append(
            f"--- second message (text, mentions {mentions}) ---\n{part['text']['content']}"
        )
    return "\n\n".join(texts) + "\n"


@pytest.mark.parametrize(
    ("name", "channel_type", "locale", "batch"), _cases(), ids=[c[0] for c in _cases()]
)
def test_rendering_matches_golden_file(
    name: str, channel_type: str, locale: str, batch: AlertBatch
) -> None:
    message = _render(channel_type, locale, batch)
    expected = {GOLDEN / f"{name}.json": _document(message)}
    preview = _markdown_preview(message)
    if preview is not None:
        expected[GOLDEN / f"{name}.md"] = preview
    for path, text in expected.items():
        if REGENERATE:
            GOLDEN.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            continue
        assert path.exists(), f"{path} is missing; regenerate with RLGUARD_REGEN_GOLDEN=1"
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.name} differs from the renderer's output"
        )


def test_no_stale_golden_files() -> None:
    expected = set()
    for name, channel_type, _, _ in _cases():
        expected.add(f"{name}.json")
        if channel_type == "wecom":
            expected.add(f"{name}.md")
    present = {p.name for p in GOLDEN.glob("*") if p.suffix in (".json", ".md")}
    assert present == expected
