"""The node page's quota panel: each per-node limit with its use now and the batches it refused
(``app.ingest.quotas``; the settings are ``node_quotas.*``, docs/deploy.md)."""

from __future__ import annotations

from dataclasses import dataclass

from app.ingest.quotas import NodeQuotas, Quota

_TITLES: dict[Quota, str] = {
    Quota.MAX_SERIES: "Series in the window",
    Quota.MAX_LABEL_VALUES: "Values of one label (fullest)",
    Quota.MAX_JOBS: "Jobs reporting",
    Quota.MAX_PARTICIPANTS: "Processes reporting",
    Quota.NEW_SERIES_BURST: "New-series budget spent",
    Quota.NEW_SERIES_PER_SECOND: "New series per second",
    Quota.INGEST_CPU_BURST_SECONDS: "Ingest CPU budget spent",
    Quota.INGEST_CPU_SHARE: "Ingest CPU share of a core",
}
# Rates: shown by their refusals only (their budgets have rows of their own).
_RATES = frozenset({Quota.NEW_SERIES_PER_SECOND, Quota.INGEST_CPU_SHARE})


@dataclass(frozen=True, slots=True)
class QuotaRow:
    title: str
    used: float | None  # None: a rate, shown by its refusals only
    limit: float
    refused: int
    env: str  # the setting's environment variable
    detail: str
    level: str  # ok | warn | bad, as the page's badges


def quota_rows(quotas: NodeQuotas, node: str) -> list[QuotaRow]:
    rows = []
    for use in quotas.usage(node):
        rate = use.quota in _RATES
        level = "bad" if use.refused else "warn" if not rate and use.ratio >= 0.8 else "ok"
        rows.append(
            QuotaRow(
                title=_TITLES[use.quota],
                used=None if rate else use.used,
                limit=use.limit,
                refused=use.refused,
                env=use.quota.env,
                detail=use.detail,
                level=level,
            )
        )
    return rows
