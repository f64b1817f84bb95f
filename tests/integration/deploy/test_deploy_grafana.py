"""deploy/grafana: every panel's query is PromQL the real promtool accepts, and names only
series that exist (recorded by deploy/prometheus/rules.yml, or an agent metric with the
rlguard_ prefix /metrics gives it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from recovery.protocol.metric_names import ALL_METRICS

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "rlguard-golden.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p.get("targets", [])]


def _check(tmp_path: Path, queries: list[tuple[str, str]]) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (Debian package: prometheus)"
    # promtool checks PromQL inside rule files: one recording rule per panel query, with the
    # dashboard variable replaced by what "All" selects.
    rules = [
        {"record": f"dashboard:panel_{i}:check", "expr": expr.replace("$job", ".*")}
        for i, (_title, expr) in enumerate(queries)
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


def test_every_panel_query_is_valid_promql_for_promtool(tmp_path: Path) -> None:
    queries = _queries()
    assert any("rlguard_rollout_engine_up" in q for _, q in queries)
    assert any("kv_cache_usage" in q for _, q in queries)
    assert any("rlguard_incidents_open" in q for _, q in queries)  # open train_hang and others
    r = _check(tmp_path, queries)
    assert r.returncode == 0, r.stdout + r.stderr
    broken = _check(tmp_path, [("broken", 'sum by (job) (rlguard_rollout_engine_up{job=~"$job"}')])
    assert broken.returncode != 0  # the check can fail


def test_every_panel_names_series_that_exist() -> None:
    doc = yaml.safe_load(RULES.read_text())
    recorded = {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    known = recorded | {f"rlguard_{name}" for name in ALL_METRICS}
    for title, expr in _queries():
        names = set(re.findall(r"\b([a-z_]+:[a-z0-9_]+:[a-z0-9_]+|rlguard_[a-z0-9_]+)", expr))
        assert names and names <= known, (title, sorted(names - known))
