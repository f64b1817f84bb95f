"""The metric names on the wire are one contract: every name the server reads is one an agent
sends, and every name is a valid Prometheus name. A name renamed on one side fails here."""

from __future__ import annotations

import re

from recovery.protocol import metric_names as names

METRIC_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def _read_by_the_server() -> dict[str, str]:
    """The module's constants naming a metric (not a label, not a set)."""
    return {
        attr: value
        for attr, value in vars(names).items()
        if attr.isupper() and isinstance(value, str) and not attr.startswith("LABEL_")
    }


def test_every_name_the_server_reads_is_sent_by_an_agent() -> None:
    read = _read_by_the_server()
    assert len(read) > 40  # the golden metrics, the job's faults, GPU health, the engines ...
    missing = {attr: value for attr, value in read.items() if value not in names.ALL_METRICS}
    assert missing == {}


def test_every_name_is_a_prometheus_name_and_the_kinds_do_not_overlap() -> None:
    assert all(METRIC_NAME.fullmatch(n) for n in names.ALL_METRICS)
    kinds = [names.GPU_METRICS, names.JOB_METRICS, names.SCHEDULER_METRICS, names.AGENT_METRICS]
    assert sum(len(k) for k in kinds) == len(names.ALL_METRICS)
    assert names.TRAINER_SIGNALS <= names.JOB_METRICS


def test_the_spool_keeps_job_signals_longest() -> None:
    assert names.is_job_signal(names.ROLLOUT_PENDING_RATIO)
    assert names.is_job_signal(names.SLURM_NODE_UNAVAILABLE)
    assert not names.is_job_signal(names.GPU_UTILIZATION_RATIO)
    assert not names.is_job_signal("agent_spool_bytes")
