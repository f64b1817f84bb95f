"""Alert channel configuration: several Slack, WeCom and generic-webhook channels.

Webhook URLs are secrets (a Slack URL or a WeCom robot `key` lets anyone post into the
channel). They are held as `SecretStr`, shown everywhere as `masked_url` (scheme and host only),
and the raw value is read in exactly one place: the delivery client, when it posts.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from app.alerts.errors import AlertConfigError
from app.alerts.events import AlertEvent
from app.models.auth import Role
from app.policy.signals import Tier

Locale = Literal["en", "zh"]

_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
_SECRET_FIELDS = frozenset({"url", "signing_secret"})


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_webhook_url(raw: str, *, allow_insecure_http: bool = False) -> str:
    """Return the URL's host after checking its shape; errors never echo the URL (a secret)."""
    parts = urlsplit(raw)
    host = parts.hostname or ""
    if parts.scheme not in ("https", "http") or not host:
        raise AlertConfigError(
            f"webhook url must be an absolute http(s) URL (got scheme {parts.scheme!r})"
        )
    if parts.username or parts.password:
        raise AlertConfigError("webhook url must not carry user:password (use the channel secret)")
    if parts.scheme == "http" and not (allow_insecure_http or _is_loopback(host)):
        raise AlertConfigError(
            f"webhook url for host {host!r} must use https (plain http only for loopback hosts)"
        )
    return host.lower()


def mask_url(raw: str) -> str:
    """`https://hooks.slack.com/***`: enough to tell channels apart, nothing to post with."""
    parts = urlsplit(raw)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/***"


class _ChannelBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME_PATTERN)
    url: SecretStr
    min_tier: Tier = Tier.MEDIUM
    muted: bool = False
    locale: Locale = "en"
    allow_insecure_http: bool = False

    @model_validator(mode="after")
    def _check_url(self) -> _ChannelBase:
        try:
            check_webhook_url(
                self.url.get_secret_value(), allow_insecure_http=self.allow_insecure_http
            )
        except AlertConfigError as exc:
            raise ValueError(f"channel {self.name!r}: {exc}") from None
        return self

    @property
    def host(self) -> str:
        return check_webhook_url(
            self.url.get_secret_value(), allow_insecure_http=self.allow_insecure_http
        )

    @property
    def masked_url(self) -> str:
        return mask_url(self.url.get_secret_value())

    def accepts(self, event: AlertEvent) -> bool:
        """Whether this channel wants `event`: not muted, and the event's tier is high enough."""
        return not self.muted and event.tier >= self.min_tier

    def public(self, *, reveal_contacts: bool = False) -> dict[str, Any]:
        """What the API and the UI may show: everything but secrets, the URL masked.

        People's contact details (WeCom phone numbers) are masked too unless
        ``reveal_contacts`` (admins, ``CONTACTS_READER_ROLE``).
        """
        data = self.model_dump(mode="json", exclude={"url", "signing_secret"})
        data["url"] = self.masked_url
        return data

    def __repr_args__(self) -> Any:
        for key, value in super().__repr_args__():
            yield (key, self.masked_url) if key == "url" else (key, value)


# Who may see the people behind a channel (phone numbers) in the API and on the settings page.
CONTACTS_READER_ROLE = Role.admin


def mask_mobile(mobile: str) -> str:
    """A phone number with all but its last four digits hidden ("@all" is no one's number)."""
    if mobile == "@all":
        return mobile
    return "*" * max(0, len(mobile) - 4) + mobile[-4:]


class SlackChannel(_ChannelBase):
    type: Literal["slack"] = "slack"


class WeComChannel(_ChannelBase):
    type: Literal["wecom"] = "wecom"
    # Phone numbers (or "@all") mentioned by the extra text message sent on the heavy tier;
    # WeCom markdown messages cannot mention anyone by phone number.
    mentioned_mobile_list: tuple[str, ...] = ()
    # Minimum pause before retrying after the robot says "too many messages" (errcode 45009).
    rate_limit_pause_s: float = Field(default=60.0, ge=0.0, le=600.0)
    max_per_minute: int = Field(default=20, ge=1, le=20)

    def public(self, *, reveal_contacts: bool = False) -> dict[str, Any]:
        data = super().public()
        if not reveal_contacts:
            data["mentioned_mobile_list"] = [mask_mobile(m) for m in self.mentioned_mobile_list]
        return data

    @field_validator("mentioned_mobile_list")
    @classmethod
    def _check_mobiles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for mobile in value:
            if mobile != "@all" and not (
                mobile.isascii() and mobile.lstrip("+").isdigit() and 5 <= len(mobile) <= 20
            ):
                raise ValueError(
                    f"mentioned_mobile_list entry {mobile!r} is not a phone number or '@all'"
                )
        return value


class WebhookChannel(_ChannelBase):
    type: Literal["webhook"] = "webhook"
    signing_secret: SecretStr

    @field_validator("signing_secret")
    @classmethod
    def _check_secret(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 16:
            raise ValueError("signing_secret must be at least 16 characters")
        return value


ChannelConfig = Annotated[SlackChannel | WeComChannel | WebhookChannel, Field(discriminator="type")]


class AlertsConfig(BaseModel):
    """Everything the alerting pipeline needs to know, validated on load."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    external_base_url: str = "http://127.0.0.1:8000"
    incident_path: str = "/incidents/{incident_id}"
    approval_path: str = "/approvals/{approval_id}"
    # Where a fault kind's runbook is served (app/views/runbooks.py renders docs/runbooks/).
    runbook_path: str = "/runbooks/{kind}"
    group_wait_s: float = Field(default=10.0, ge=0.0, le=600.0)
    repeat_interval_s: float = Field(default=1800.0, ge=60.0, le=7 * 86400.0)
    # A worker's claim on a delivery; after a worker dies mid-send the row is sent again once
    # this expired (at-least-once: the receiver may see that one message twice).
    claim_lease_s: float = Field(default=360.0, ge=5.0, le=3600.0)
    # Task runs per delivery (each run makes a couple of quick tries) before it is failed.
    max_task_runs: int = Field(default=4, ge=1, le=20)
    retry_base_delay_s: float = Field(default=60.0, ge=1.0, le=3600.0)
    # Finished delivery rows are deleted after this many days.
    retention_days: float = Field(default=90.0, gt=0.0)
    channels: tuple[ChannelConfig, ...] = ()
    # Optional operator allowlist: when set, every channel's host must be in it, and the
    # delivery client refuses any other host even if a channel somehow named one.
    host_allowlist: tuple[str, ...] = ()

    @field_validator("external_base_url")
    @classmethod
    def _check_base(cls, value: str) -> str:
        parts = urlsplit(value)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.query
            or parts.fragment
        ):
            raise ValueError(f"external_base_url {value!r} must be an http(s) URL without query")
        return value.rstrip("/")

    @field_validator("incident_path", "approval_path", "runbook_path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if not value.startswith("/") or value.count("{") != 1:
            raise ValueError(
                f"path template {value!r} must start with '/' and hold one placeholder"
            )
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> AlertsConfig:
        seen: set[str] = set()
        for channel in self.channels:
            if channel.name in seen:
                raise ValueError(f"channel name {channel.name!r} is used twice")
            seen.add(channel.name)
        if self.host_allowlist:
            allowed = {h.lower() for h in self.host_allowlist}
            for channel in self.channels:
                if channel.host not in allowed:
                    raise ValueError(
                        f"channel {channel.name!r}: host {channel.host!r} is not in host_allowlist"
                    )
        return self

    @property
    def group_wait(self) -> timedelta:
        return timedelta(seconds=self.group_wait_s)

    @property
    def repeat_interval(self) -> timedelta:
        return timedelta(seconds=self.repeat_interval_s)

    def channel(self, name: str) -> ChannelConfig:
        for channel in self.channels:
            if channel.name == name:
                return channel
        known = ", ".join(c.name for c in self.channels) or "none"
        raise AlertConfigError(f"no alert channel named {name!r} (configured: {known})")

    def allowed_hosts(self) -> frozenset[str]:
        if self.host_allowlist:
            return frozenset(h.lower() for h in self.host_allowlist)
        return frozenset(c.host for c in self.channels)

    def incident_url(self, incident_id: int) -> str:
        return self.external_base_url + self.incident_path.format(incident_id=int(incident_id))

    def approval_url(self, approval_id: int) -> str:
        return self.external_base_url + self.approval_path.format(approval_id=int(approval_id))

    def runbook_url(self, kind: str) -> str:
        return self.external_base_url + self.runbook_path.format(kind=quote(kind, safe=""))


def parse_alerts_config(data: object) -> AlertsConfig:
    """Validate a mapping into `AlertsConfig`; errors name the bad key and never echo secrets."""
    try:
        return AlertsConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            where = ".".join(str(p) for p in err["loc"]) or "<root>"
            # A scalar value is echoed unless its field holds a secret (a URL or a signing key);
            # mappings are never echoed since they may contain one.
            value = err.get("input")
            secret = any(p in _SECRET_FIELDS for p in err["loc"])
            scalar = isinstance(value, str | int | float | bool)
            shown = f" (got {value!r})" if scalar and not secret else ""
            problems.append(f"{where}: {err['msg']}{shown}")
        raise AlertConfigError("invalid alerts configuration: " + "; ".join(problems)) from None


def read_alerts_file(path: Path) -> dict[str, Any]:
    """The raw alerts mapping of a YAML file (its `alerts:` key, or the whole file)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise AlertConfigError(f"cannot read alerts configuration {path}: {exc}") from None
    if isinstance(data, dict) and "alerts" in data:
        data = data["alerts"]
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AlertConfigError(
            f"alerts configuration {path} must be a mapping, got {type(data).__name__}"
        )
    return data


def load_alerts_config(path: Path) -> AlertsConfig:
    """Read and validate an alerts configuration from a YAML file."""
    return parse_alerts_config(read_alerts_file(path))
