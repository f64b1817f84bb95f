from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from app.alerts.config import SlackChannel, WebhookChannel, WeComChannel
from app.alerts.grouping import AlertBatch
from app.alerts.message import encode_body, truncate_utf8
from app.alerts.render import render_batch, render_test_message
from app.alerts.slack import HEADER_MAX
from app.alerts.webhook import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signature_headers,
    verify_signature,
)
from app.alerts.wecom import MARKDOWN_MAX_BYTES, TEXT_MAX_BYTES
from app.policy.signals import Tier
from tests.unit.app.alerts._factories import (
    T0,
    WEBHOOK_SIGNING,
    config,
    decided,
    event,
    tier_scenario,
)

CFG = config()
SLACK, WECOM, HOOK = CFG.channels
assert (
    isinstance(SLACK, SlackChannel)
    and isinstance(WECOM, WeComChannel)
    and isinstance(HOOK, WebhookChannel)
)


def heavy_batch() -> AlertBatch:
    return AlertBatch(tuple(tier_scenario(Tier.HEAVY)))


def test_slack_block_kit_shape() -> None:
    (payload,) = render_batch(heavy_batch(), channel=SLACK, config=CFG).parts
    assert payload["text"].startswith("🔴 [HEAVY] Incident #42: opened · approval needed")
    types = [b["type"] for b in payload["blocks"]]
    assert types == ["header", "section", "section", "context", "actions"]
    header = payload["blocks"][0]["text"]
    assert header["type"] == "plain_text" and header["text"].startswith("🔴 HEAVY")
    fields = [f["text"].split("\n")[0] for f in payload["blocks"][1]["fields"]]
    assert fields == ["*Job*", "*Node*", "*Role*", "*Fault*", "*Evidence*", "*Actions taken*"]
    buttons = payload["blocks"][-1]["elements"]
    assert [b["url"] for b in buttons] == [
        "https://rlguard.example.com/incidents/42",
        "https://rlguard.example.com/approvals/7",
        "https://rlguard.example.com/runbooks/nodes_lost",
    ]


def test_every_channel_links_the_runbook_of_the_incidents_kind() -> None:
    runbook = "https://rlguard.example.com/runbooks/nodes_lost"
    (slack,) = render_batch(heavy_batch(), channel=SLACK, config=CFG).parts
    assert slack["blocks"][-1]["elements"][-1]["url"] == runbook
    (hook,) = render_batch(heavy_batch(), channel=HOOK, config=CFG).parts
    assert hook["links"]["runbook"] == runbook
    for locale, label in (("en", "Runbook"), ("zh", "处置手册")):
        channel = WECOM.model_copy(update={"locale": locale})
        wecom = render_batch(heavy_batch(), channel=channel, config=CFG).parts[0]
        assert f"[{label}]({runbook})" in wecom["markdown"]["content"]


def test_slack_has_no_approval_button_once_decided_or_resolved() -> None:
    batch = AlertBatch((decided(),))
    (payload,) = render_batch(batch, channel=SLACK, config=CFG).parts
    actions = [b["action_id"] for b in payload["blocks"][-1]["elements"]]
    assert actions == ["open_incident", "open_runbook"]
    assert "Approved by alice: “restore from step 1400”" in json.dumps(payload, ensure_ascii=False)


def test_slack_limits_and_escaping_of_ingested_text() -> None:
    nasty = event(
        job="<!channel> <https://evil.example|click> & co" + "x" * 300,
        evidence_summary="y" * 2000,
        fault_kind="k" * 200,
    )
    (payload,) = render_batch(AlertBatch((nasty,)), channel=SLACK, config=CFG).parts
    dumped = json.dumps(payload)
    assert "<!channel>" not in dumped and "<https://evil" not in dumped
    assert "&lt;!channel&gt;" in dumped and "&amp; co" in dumped
    assert len(payload["blocks"][0]["text"]["text"]) <= HEADER_MAX
    fields = payload["blocks"][1]["fields"]
    assert len(fields) <= 10 and all(len(f["text"]) <= 2000 for f in fields)
    evidence = next(f["text"] for f in fields if f["text"].startswith("*Evidence*"))
    assert len(evidence) < 700 and evidence.endswith("…")


def test_wecom_markdown_colour_per_tier_and_resolved() -> None:
    colours = {}
    for tier in Tier:
        (md, *_) = render_batch(
            AlertBatch(tuple(tier_scenario(tier))), channel=WECOM, config=CFG
        ).parts
        assert md["msgtype"] == "markdown"
        colours[tier] = md["markdown"]["content"].split('"')[1]
    assert colours == {Tier.LIGHT: "comment", Tier.MEDIUM: "info", Tier.HEAVY: "warning"}
    (md,) = render_batch(
        AlertBatch((event(kind="resolved", tier="heavy"),)), channel=WECOM, config=CFG
    ).parts
    assert md["markdown"]["content"].startswith('<font color="info">**✅')


def test_wecom_heavy_adds_a_short_mention_text() -> None:
    md, mention = render_batch(heavy_batch(), channel=WECOM, config=CFG).parts
    assert mention["msgtype"] == "text"
    assert mention["text"]["mentioned_mobile_list"] == ["13800138000"]
    assert mention["text"]["content"].endswith("https://rlguard.example.com/approvals/7")
    assert len(mention["text"]["content"].encode()) <= TEXT_MAX_BYTES
    # Chinese locale on this channel, written as people write it.
    assert "事件 #42：已触发，等待审批" in md["markdown"]["content"]
    assert "任务已进入 SAFE_MODE" in md["markdown"]["content"]


@pytest.mark.parametrize(
    "batch",
    [
        AlertBatch((event(tier="medium"),)),  # not heavy
        AlertBatch((event(kind="resolved", tier="heavy"),)),  # nothing to do
        AlertBatch((decided(),)),  # a decision wakes nobody
    ],
)
def test_wecom_mentions_only_when_someone_must_act_on_heavy(batch: AlertBatch) -> None:
    assert len(render_batch(batch, channel=WECOM, config=CFG).parts) == 1


def test_wecom_without_mobiles_sends_markdown_only() -> None:
    quiet = WECOM.model_copy(update={"mentioned_mobile_list": ()})
    assert len(render_batch(heavy_batch(), channel=quiet, config=CFG).parts) == 1


def test_wecom_content_is_cut_within_limits_on_a_character_boundary() -> None:
    huge = replace(
        tier_scenario(Tier.HEAVY)[1],
        evidence_summary="节点心跳丢失" * 400,
        job="任务" * 100,
        actions_taken=tuple(f"动作{i}" * 9 for i in range(20)),
    )
    md, mention = render_batch(AlertBatch((huge,)), channel=WECOM, config=CFG).parts
    content = md["markdown"]["content"]
    raw = content.encode("utf-8")
    assert len(raw) <= MARKDOWN_MAX_BYTES
    raw.decode("utf-8", errors="strict")  # no split character
    assert "内容过长已截断" in content
    assert content.count("<font") == content.count("</font>") == 2
    assert "[去审批](https://rlguard.example.com/approvals/7)" in content  # links survive a cut
    assert len(mention["text"]["content"].encode("utf-8")) <= TEXT_MAX_BYTES
    assert len(encode_body(md)) < MARKDOWN_MAX_BYTES + 200


def test_wecom_neutralizes_markup_in_ingested_text() -> None:
    sneaky = event(job='<font color="info">ok</font> [x](https://evil.example) <@all>')
    (md,) = render_batch(AlertBatch((sneaky,)), channel=WECOM, config=CFG).parts
    content = md["markdown"]["content"]
    assert "(https://evil.example)" in content and "[x]" not in content
    assert content.count("<font") == 2 and "<@all>" not in content


def test_truncate_utf8_never_splits_a_character() -> None:
    assert truncate_utf8("abc", 3) == "abc"
    assert truncate_utf8("汉字汉字", 9) == "汉字…"  # 3 bytes per character, suffix included
    assert truncate_utf8("汉字汉字", 8) == "汉…"
    for limit in range(1, 14):
        assert len(truncate_utf8("😀汉a字", limit).encode()) <= limit


def test_webhook_body_is_signed_and_verifiable() -> None:
    (body,) = render_batch(heavy_batch(), channel=HOOK, config=CFG).parts
    assert body["schema"] == "rlguard.alert/v1" and body["incident_id"] == 42
    assert body["kinds"] == ["opened", "approval_requested"]
    assert body["approval"] == {
        "id": 7,
        "pending": True,
        "decision": None,
        "decided_by": None,
        "comment": None,
    }
    assert body["dedupe_key"] == "incident:42/event:e1/channel:pager"
    raw = encode_body(body)
    now = time.time()
    headers = signature_headers(WEBHOOK_SIGNING, body=raw, now=now)
    ts, sig = headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER]
    assert verify_signature(WEBHOOK_SIGNING, body=raw, timestamp=ts, signature=sig, now=now)
    assert not verify_signature(
        WEBHOOK_SIGNING, body=raw + b" ", timestamp=ts, signature=sig, now=now
    )
    assert not verify_signature(
        "another-secret-value", body=raw, timestamp=ts, signature=sig, now=now
    )
    assert not verify_signature(
        WEBHOOK_SIGNING, body=raw, timestamp=ts, signature=sig, now=now + 301
    )
    assert not verify_signature(WEBHOOK_SIGNING, body=raw, timestamp="soon", signature=sig, now=now)


def test_test_message_for_each_channel() -> None:
    for channel in CFG.channels:
        message = render_test_message(channel=channel, config=CFG, now=T0)
        assert message.channel_type == channel.type
        dumped = json.dumps(message.parts, ensure_ascii=False)
        assert channel.name in dumped
