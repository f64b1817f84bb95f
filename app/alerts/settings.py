"""Where the server finds its alert channels (``Settings.alerts``, app/core/config.py).

The channels live in a YAML file, kept out of the shared policy file since webhook URLs are
secrets: `RLGUARD_ALERTS_FILE`, else `<data_dir>/alerts.yaml` when it exists, else no channels.
`RLGUARD_ALERTS_EXTERNAL_BASE_URL` overrides the base URL of the links in messages; without
either, links point at the server's own bind address. Example `alerts.yaml`:

    alerts:
      external_base_url: https://rlguard.example.com
      group_wait_s: 10
      repeat_interval_s: 1800
      channels:
        - {type: slack, name: oncall-slack, url: "https://hooks.slack.com/…", min_tier: medium}
        - {type: wecom, name: oncall-wecom, url: "https://qyapi.weixin.qq.com/…", locale: zh,
           min_tier: medium, mentioned_mobile_list: ["13800138000"]}
        - {type: webhook, name: pager, url: "https://pager.example.com/hook", signing_secret: "…"}
"""

from __future__ import annotations

from app.alerts.config import AlertsConfig, parse_alerts_config, read_alerts_file
from app.alerts.errors import AlertConfigError
from app.core.config import Settings

DEFAULT_FILE_NAME = "alerts.yaml"


def load_server_alerts_config(settings: Settings) -> AlertsConfig:
    """The alerts configuration the server and its workers use (see the module docstring)."""
    env, data_dir, host, port = settings.alerts, settings.data_dir, settings.host, settings.port
    if env.file is not None:
        if not env.file.is_file():
            raise AlertConfigError(f"RLGUARD_ALERTS_FILE={str(env.file)!r} does not exist")
        data = read_alerts_file(env.file)
    elif (data_dir / DEFAULT_FILE_NAME).is_file():
        data = read_alerts_file(data_dir / DEFAULT_FILE_NAME)
    else:
        data = {}
    if env.external_base_url:
        data["external_base_url"] = env.external_base_url
    # A wildcard bind is reachable on loopback at least (as `rlguard up` prints it).
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    data.setdefault("external_base_url", f"http://{shown}:{port}")
    return parse_alerts_config(data)
