"""The server's own Prometheus metrics: ingest, commits, HTTP latency, rollups.

Every metric is created on the registry given to ``ServerMetrics``, so each app (and each test)
can use a fresh ``CollectorRegistry``. They live in ``app.core`` because the subsystems that count
(ingest, rollups, the HTTP middleware) sit above it, while ``app.metrics``, which exports what
those subsystems hold, sits above them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    """The server's own metrics, all registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.ingest_batches = Counter(
            "rlguard_ingest_batches",
            "Ingest batches answered, by result (accepted or duplicate)",
            ["result"],
            registry=registry,
        )
        self.ingest_samples = Counter(
            "rlguard_ingest_samples", "Samples applied to the series store", registry=registry
        )
        self.ingest_rejections = Counter(
            "rlguard_ingest_rejections",
            "Ingest requests refused, by reason class",
            ["reason"],
            registry=registry,
        )
        # Bounded: a node label only for nodes holding a token, a quota label of six values.
        self.ingest_quota_refusals = Counter(
            "rlguard_ingest_quota_refusals",
            "Ingest batches refused because they would take their node past a per-node quota "
            "(node_quotas.<quota>), by node and quota",
            ["node", "quota"],
            registry=registry,
        )
        self.ingest_commit_seconds = Histogram(
            "rlguard_ingest_commit_duration_seconds",
            "Time to commit one group of ingest batches to the database",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.ingest_commit_group_size = Histogram(
            "rlguard_ingest_commit_group_batches",
            "Batches committed together in one transaction",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=registry,
        )
        self.ingest_commits = Counter(
            "rlguard_ingest_commits",
            "Ingest group commits by where they ran: inline (event loop, SQLite), loop (event loop, "
            "PostgreSQL asyncio connection) or thread",
            ["path"],
            registry=registry,
        )
        self.ingest_commit_failures = Counter(
            "rlguard_ingest_commit_failures",
            "Failed ingest group commits (retried)",
            registry=registry,
        )
        self.ingest_batches_rejected = Counter(
            "rlguard_ingest_batches_rejected",
            "Batches the database refused at commit (isolated from their group, answered 422), "
            "by the body field whose write failed; non-zero means validation has a gap",
            ["reason"],
            registry=registry,
        )
        self.http_request_seconds = Histogram(
            "rlguard_http_request_duration_seconds",
            "HTTP request latency by method, route template and status",
            ["method", "route", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.rollup_rows = Counter(
            "rlguard_rollup_rows_written",
            "Per-minute rollup rows written (inserted or merged)",
            registry=registry,
        )
        self.rollup_failures = Counter(
            "rlguard_rollup_failures", "Failed rollup passes (retried)", registry=registry
        )
