from __future__ import annotations

from pathlib import Path

import pytest

from app.alerts.config import AlertsConfig
from app.alerts.errors import AlertConfigError
from app.alerts.settings import load_server_alerts_config
from app.core.config import AlertFileSettings, Settings


def _load(data_dir: Path, host: str = "h", port: int = 1, **alerts: object) -> AlertsConfig:
    settings = Settings(data_dir=data_dir, host=host, port=port, alerts=AlertFileSettings(**alerts))
    return load_server_alerts_config(settings)


YAML = "alerts:\n  channels:\n    - {type: slack, name: ops, url: 'https://hooks.slack.com/services/a/b/c'}\n"


def test_no_file_means_no_channels_and_links_to_the_server(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "10.0.0.5", 8100)
    assert cfg.channels == () and cfg.external_base_url == "http://10.0.0.5:8100"


def test_data_dir_file_and_base_url_override(tmp_path: Path) -> None:
    (tmp_path / "alerts.yaml").write_text(YAML, encoding="utf-8")
    cfg = _load(tmp_path, "127.0.0.1", 8000, external_base_url="https://rlguard.example.com/")
    assert [c.name for c in cfg.channels] == ["ops"]
    assert cfg.external_base_url == "https://rlguard.example.com"


def test_environment_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "elsewhere.yaml"
    path.write_text(YAML, encoding="utf-8")
    monkeypatch.setenv("RLGUARD_ALERTS_FILE", str(path))
    cfg = _load(tmp_path / "empty", host="h", port=1)
    assert [c.name for c in cfg.channels] == ["ops"]


def test_a_named_file_that_is_missing_or_bad_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AlertConfigError, match="RLGUARD_ALERTS_FILE='.*nope.yaml' does not exist"):
        _load(tmp_path, host="h", port=1, file=tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("alerts: [1, 2]\n", encoding="utf-8")
    with pytest.raises(AlertConfigError, match="must be a mapping, got list"):
        _load(tmp_path, host="h", port=1, file=bad)
    bad.write_text(
        "alerts:\n  channels:\n    - {type: slack, name: ops, url: 'http://hooks.slack.com/x/secretpart'}\n"
    )
    with pytest.raises(AlertConfigError) as err:
        _load(tmp_path, host="h", port=1, file=bad)
    assert "must use https" in str(err.value) and "secretpart" not in str(err.value)


@pytest.mark.parametrize(
    ("host", "base"),
    [
        ("0.0.0.0", "http://127.0.0.1:18080"),
        ("::", "http://127.0.0.1:18080"),
        ("10.1.2.3", "http://10.1.2.3:18080"),
    ],
)
def test_links_default_to_the_bind_address_and_a_wildcard_to_loopback(
    tmp_path: Path, host: str, base: str
) -> None:
    cfg = _load(tmp_path, host=host, port=18080)
    assert cfg.external_base_url == base
