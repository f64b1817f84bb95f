from __future__ import annotations

from pathlib import Path

import pytest

from app.alerts.config import WebhookChannel, load_alerts_config, parse_alerts_config
from app.alerts.errors import AlertConfigError
from app.policy.signals import Tier
from tests.unit.app.alerts._factories import (
    SLACK_SECRET_PATH,
    WEBHOOK_SIGNING,
    WECOM_KEY,
    config,
    event,
)

SECRETS = ("slacksecrettoken123", "T0SECRET1", WECOM_KEY, WEBHOOK_SIGNING)


def test_several_channels_of_each_type() -> None:
    cfg = parse_alerts_config(
        {
            "channels": [
                {"type": "slack", "name": "a", "url": "https://hooks.slack.com/services/x/y/z"},
                {
                    "type": "slack",
                    "name": "b",
                    "url": "https://hooks.slack.com/services/x/y/w",
                    "locale": "zh",
                },
                {
                    "type": "wecom",
                    "name": "c",
                    "url": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k1",
                },
                {
                    "type": "wecom",
                    "name": "d",
                    "url": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k2",
                },
            ]
        }
    )
    assert [c.name for c in cfg.channels] == ["a", "b", "c", "d"]
    assert cfg.allowed_hosts() == {"hooks.slack.com", "qyapi.weixin.qq.com"}
    assert cfg.group_wait_s == 10.0 and cfg.repeat_interval_s == 1800.0
    assert cfg.channels[1].locale == "zh" and cfg.channels[0].min_tier is Tier.MEDIUM


def test_secrets_never_show_in_repr_str_public_or_json() -> None:
    cfg = config("https://hooks.example.com")
    shown = [repr(cfg), str(cfg), cfg.model_dump_json(), *(str(c.public()) for c in cfg.channels)]
    for text in shown:
        for secret in SECRETS:
            assert secret not in text
    assert cfg.channels[0].public()["url"] == "https://hooks.example.com/***"
    assert "signing_secret" not in cfg.channels[2].public()


def test_min_tier_and_mute_decide_what_a_channel_accepts() -> None:
    cfg = parse_alerts_config(
        {
            "channels": [
                {
                    "type": "slack",
                    "name": "heavy-only",
                    "url": "https://h.example/x",
                    "min_tier": "heavy",
                },
                {
                    "type": "slack",
                    "name": "muted",
                    "url": "https://h.example/y",
                    "min_tier": "light",
                    "muted": True,
                },
            ]
        }
    )
    heavy_only, muted = cfg.channels
    assert heavy_only.accepts(event(tier="heavy")) and not heavy_only.accepts(event(tier="medium"))
    assert not muted.accepts(event(tier="heavy"))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"channels": [{"type": "slack", "name": "Bad Name", "url": "https://h/x"}]},
            "channels.0.slack.name",
        ),
        ({"channels": [{"type": "sms", "name": "a", "url": "https://h/x"}]}, "channels.0"),
        (
            {
                "channels": [
                    {"type": "slack", "name": "a", "url": "https://h/x", "min_tier": "huge"}
                ]
            },
            "min_tier",
        ),
        (
            {"channels": [{"type": "slack", "name": "a", "url": "https://h/x", "colour": 1}]},
            "colour",
        ),
        (
            {"channels": [{"type": "slack", "name": "a", "url": "https://h/x", "locale": "fr"}]},
            "locale",
        ),
        ({"group_wait_s": -1}, "group_wait_s"),
        ({"repeat_interval_s": 5}, "repeat_interval_s"),
        ({"external_base_url": "ftp://x"}, "external_base_url"),
        ({"approval_path": "approvals"}, "approval_path"),
        (
            {
                "channels": [
                    {"type": "slack", "name": "a", "url": "https://h/x"},
                    {"type": "slack", "name": "a", "url": "https://h/y"},
                ]
            },
            "channel name 'a' is used twice",
        ),
        (
            {
                "channels": [
                    {
                        "type": "webhook",
                        "name": "w",
                        "url": "https://h/x",
                        "signing_secret": "short",
                    }
                ]
            },
            "at least 16",
        ),
        ({"channels": [{"type": "webhook", "name": "w", "url": "https://h/x"}]}, "signing_secret"),
        (
            {
                "channels": [
                    {
                        "type": "wecom",
                        "name": "w",
                        "url": "https://h/x",
                        "mentioned_mobile_list": ["bob"],
                    }
                ]
            },
            "'bob'",
        ),
    ],
)
def test_bad_configuration_names_the_bad_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(AlertConfigError) as err:
        parse_alerts_config(data)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.slack.com" + SLACK_SECRET_PATH,  # plain http to a remote host
        "ftp://hooks.slack.com" + SLACK_SECRET_PATH,
        "hooks.slack.com" + SLACK_SECRET_PATH,
        "https://user:T0SECRET1@hooks.slack.com/x",
    ],
)
def test_bad_urls_are_refused_without_echoing_them(url: str) -> None:
    with pytest.raises(AlertConfigError) as err:
        parse_alerts_config({"channels": [{"type": "slack", "name": "a", "url": url}]})
    assert "channels.0" in str(err.value)
    assert "slacksecrettoken123" not in str(err.value) and "T0SECRET1" not in str(err.value)


def test_http_is_accepted_for_loopback_only() -> None:
    cfg = parse_alerts_config(
        {"channels": [{"type": "slack", "name": "a", "url": "http://127.0.0.1:9/x"}]}
    )
    assert cfg.channels[0].host == "127.0.0.1"


def test_unknown_channel_lookup_lists_the_known_ones() -> None:
    with pytest.raises(
        AlertConfigError,
        match=r"no alert channel named 'nope' \(configured: ops-slack, ops-wecom, pager\)",
    ):
        config().channel("nope")


def test_links_use_the_external_base_url() -> None:
    cfg = parse_alerts_config({"external_base_url": "https://rlguard.example.com/"})
    assert cfg.incident_url(42) == "https://rlguard.example.com/incidents/42"
    assert cfg.approval_url(7) == "https://rlguard.example.com/approvals/7"


def test_load_from_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(
        "alerts:\n  group_wait_s: 5\n  channels:\n"
        "    - {type: webhook, name: hook, url: 'https://h.example/x', signing_secret: '0123456789abcdefg'}\n",
        encoding="utf-8",
    )
    cfg = load_alerts_config(path)
    assert cfg.group_wait_s == 5 and isinstance(cfg.channels[0], WebhookChannel)
    path.write_text("alerts: {group_wait_s: [", encoding="utf-8")
    with pytest.raises(AlertConfigError, match="cannot read alerts configuration"):
        load_alerts_config(path)
    with pytest.raises(AlertConfigError, match="cannot read"):
        load_alerts_config(tmp_path / "missing.yaml")
