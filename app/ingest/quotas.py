"""Per-node quotas: what one node (one node token) may create on the server.

A node token speaks for its node, not for the server's size: each node may hold at most
``max_series`` series in the in-memory window, ``max_label_values`` distinct values of one label
of one metric name, and ``max_jobs`` jobs and ``max_participants`` training processes reported
within ``participant_window_seconds``, and may create at most ``new_series_per_second`` series
per second (a token bucket of ``new_series_burst``). What its batches cost the loop is bounded
apart (``app.ingest.cpu_share``, asked by ``admit_request``).

``NodeQuotas.admit`` judges a whole batch before anything of it is applied and before its seq is
marked: it raises ``QuotaExceeded`` naming the limit and its setting (422 for a persistent limit,
429 with ``Retry-After`` for the creation rate), or records what the batch adds. A refused batch
leaves no sample, row or seq behind. The accounting is in memory only: series leave it when the
store forgets them (``SeriesStore.on_forget``), participants after the participant window, and
after a restart every node is counted again from its first batches. With a shared window each
replica counts what it accepted: a node spread over ``R`` replicas may reach ``R`` times a limit.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from operator import itemgetter

from prometheus_client import Counter

from app.core.config import NodeQuotaSettings
from app.core.errors import TooManyRequests
from app.ingest.cpu_share import CpuBucket, CpuShare
from app.ingest.validation import IngestRejected, ValidBatch
from app.series.store import SeriesKey
from recovery.protocol.samples import ParticipantReport

_key_of_sample = itemgetter(0)


class Quota(StrEnum):
    """The per-node limits, named as their settings (``node_quotas.<name>``)."""

    MAX_SERIES = "max_series"
    MAX_LABEL_VALUES = "max_label_values"
    MAX_JOBS = "max_jobs"
    MAX_PARTICIPANTS = "max_participants"
    NEW_SERIES_PER_SECOND = "new_series_per_second"
    NEW_SERIES_BURST = "new_series_burst"
    INGEST_CPU_SHARE = "ingest_cpu_share"
    INGEST_CPU_BURST_SECONDS = "ingest_cpu_burst_seconds"

    @property
    def setting(self) -> str:
        return f"node_quotas.{self.value}"

    @property
    def env(self) -> str:
        return f"RLGUARD_NODE_QUOTAS__{self.value.upper()}"


class QuotaExceeded(IngestRejected):
    """A batch that would take its node past ``quota``: refused whole (422)."""

    def __init__(self, quota: Quota, reason: str, *, status_code: int = 422) -> None:
        super().__init__(reason, status_code=status_code, kind="quota")
        self.quota = quota


class NewSeriesRateExceeded(TooManyRequests, QuotaExceeded):
    """A batch whose new series the node's creation budget cannot pay for yet: 429 with
    ``Retry-After`` (a ``TooManyRequests``, which is what sets the header)."""

    def __init__(self, reason: str, *, retry_after: int) -> None:
        QuotaExceeded.__init__(self, Quota.NEW_SERIES_PER_SECOND, reason, status_code=429)
        self.retry_after = retry_after


class CpuShareExceeded(TooManyRequests, QuotaExceeded):
    """A request of a node whose batches took more than its share of the ingest CPU time:
    429 with ``Retry-After``, before its body is read."""

    closes_connection = True

    def __init__(self, reason: str, *, retry_after: int) -> None:
        QuotaExceeded.__init__(self, Quota.INGEST_CPU_SHARE, reason, status_code=429)
        self.retry_after = retry_after


def _refusal(node: str, quota: Quota, what: str, limit: float) -> str:
    return (
        f"node {node!r}: {what}, more than its limit {quota.setting} = {limit:g} "
        f"({quota.env}); nothing of the batch was applied"
    )


@dataclass(slots=True)
class _NodeUsage:
    """What one node holds on the server now."""

    series: set[SeriesKey] = field(default_factory=set)
    # (metric name, label name) -> label value -> how many of the node's series carry it
    label_values: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    # (job, role, rank) -> when it was last reported (monotonic), least recently reported first
    participants: OrderedDict[tuple[str, str, int], float] = field(default_factory=OrderedDict)
    jobs: dict[str, int] = field(default_factory=dict)  # job -> its counted participants
    # The series of the node's last batch that held no new one, and ``drops`` then: an agent
    # sends the same series every interval, and comparing the key list (the validator's cached
    # key objects, compared by identity in C) is several times cheaper than a set look-up each.
    last_keys: list[SeriesKey] = field(default_factory=list)
    last_drops: int = -1
    drops: int = 0  # series of the node the store forgot
    tokens: float = 0.0  # the new-series bucket
    tokens_at: float = 0.0
    refusals: dict[str, int] = field(default_factory=dict)  # quota -> batches refused
    cpu: CpuBucket | None = None  # the ingest CPU budget (app.ingest.cpu_share)


@dataclass(frozen=True, slots=True)
class QuotaUse:
    """One limit of one node: how much is used, the limit, and the batches it refused."""

    quota: Quota
    used: float
    limit: float
    refused: int
    detail: str = ""  # for max_label_values: the fullest (metric name, label)

    @property
    def ratio(self) -> float:
        return self.used / self.limit if self.limit else 0.0


class NodeQuotas:
    """The per-node accounting and its checks; one per server process, thread-safe."""

    def __init__(
        self,
        settings: NodeQuotaSettings,
        *,
        refusals: Counter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._refusals = refusals  # rlguard_ingest_quota_refusals_total{node, quota}
        self._clock = clock
        self._nodes: dict[str, _NodeUsage] = {}
        self._cpu = CpuShare(settings.ingest_cpu_share, settings.ingest_cpu_burst_seconds)
        # admit runs on the event loop, forget on the rollup pass's thread
        self._lock = threading.Lock()

    # -- the check ---------------------------------------------------------------------------

    def _usage(self, node: str, now: float) -> _NodeUsage:
        usage = self._nodes.get(node)
        if usage is None:
            usage = self._nodes[node] = _NodeUsage(
                tokens=float(self.settings.new_series_burst), tokens_at=now
            )
        return usage

    def _counted(self, node: str, usage: _NodeUsage, exc: QuotaExceeded) -> QuotaExceeded:
        usage.refusals[exc.quota] = usage.refusals.get(exc.quota, 0) + 1
        if self._refusals is not None:
            self._refusals.labels(node=node, quota=exc.quota.value).inc()
        return exc

    def admit(self, batch: ValidBatch) -> None:
        """Raise ``QuotaExceeded`` when ``batch`` would take its node past a limit (changing
        nothing); otherwise count what it adds."""
        with self._lock:
            now = self._clock()
            usage = self._usage(batch.node, now)
            try:
                new_series = self._new_series(batch, usage)
                new_participants = self._check_participants(
                    batch.node, batch.participants, usage, now
                )
                self._check_rate(batch.node, usage, len(new_series), now)
            except QuotaExceeded as exc:
                raise self._counted(batch.node, usage, exc) from None
            self._record(batch, usage, new_series, new_participants, now)

    # -- the ingest CPU share (app.ingest.cpu_share) ------------------------------------------

    def admit_request(self, node: str) -> None:
        """Raise ``CpuShareExceeded`` (429) while ``node``'s batches owe CPU time: asked before
        a request's body is read, and the answer closes the connection, so a refusal costs the
        loop nothing of the body."""
        with self._lock:
            now = self._clock()
            usage = self._nodes.get(node)
            if usage is None or usage.cpu is None:
                return
            wait = self._cpu.wait(usage.cpu, now)
            if not wait:
                return
            exc = CpuShareExceeded(
                _refusal(
                    node,
                    Quota.INGEST_CPU_SHARE,
                    f"its batches took more than its share of the server's ingest CPU time "
                    f"(a burst of {self.settings.ingest_cpu_burst_seconds:g} s, "
                    f"{Quota.INGEST_CPU_BURST_SECONDS.env})",
                    self.settings.ingest_cpu_share,
                )
                + f"; the body was not read; retry in {wait} s",
                retry_after=wait,
            )
            raise self._counted(node, usage, exc)

    def charge_cpu(self, node: str, seconds: float, *, refused: bool = False) -> None:
        """``node``'s batch took ``seconds`` of the loop thread's CPU time (``refused``: and
        was refused, which costs the node more: ``cpu_share.REFUSED_FACTOR``)."""
        with self._lock:
            now = self._clock()
            usage = self._usage(node, now)
            if usage.cpu is None:
                usage.cpu = self._cpu.new_bucket(now)
            self._cpu.charge(usage.cpu, seconds, now, refused=refused)

    # -- early, while the batch is validated (app.ingest.validation.NewSeriesGate) -------------
    # Validating a new series costs far more than looking a known one up (~30 us against
    # ~0.1 us), so a node sending 5,000 new series per request within its rate limit kept a
    # core busy with batches the quotas then refused. The validator asks these instead, before
    # the samples (jobs and processes) and as it meets each new series (the rest), and stops
    # at the first one too many: nothing costly is validated for a batch that cannot pass.

    def begin_batch(self, node: str, participants: list[ParticipantReport]) -> BatchCheck:
        """The early checks of a batch of ``node``: its processes and jobs now (raising the
        refusal ``admit`` would), its new series as the validator meets them."""
        limits = self.settings
        with self._lock:
            now = self._clock()
            usage = self._nodes.get(node)
            if usage is None:
                return BatchCheck(self, node, min(limits.max_series, limits.new_series_burst))
            try:
                self._check_participants(node, participants, usage, now)
            except QuotaExceeded as exc:
                raise self._counted(node, usage, exc) from None
            tokens = self._tokens(usage, now)
            room = max(0, min(limits.max_series - len(usage.series), int(tokens)))
            return BatchCheck(self, node, room)

    def holds(self, key: SeriesKey) -> bool:
        """Whether the node of ``key`` holds that series (it is not new)."""
        usage = self._nodes.get(key.node)
        return usage is not None and key in usage.series

    def refuse_early(self, node: str, unknown: int) -> None:
        """``BatchCheck.expect_new``: a retry (429) when ``node`` may not create ``unknown``
        series now although it may later (no more than the burst and the series room; beyond
        those, the check per series decides, after validating only what fits)."""
        limits = self.settings
        with self._lock:
            now = self._clock()
            usage = self._nodes.get(node)
            if usage is None:
                return
            tokens = self._tokens(usage, now)
            room = limits.max_series - len(usage.series)
            if unknown <= tokens or unknown > min(room, limits.new_series_burst):
                return
            raise self._counted(node, usage, self._rate_refusal(node, unknown, tokens))

    def refuse_new_series(self, node: str, at_least: int) -> QuotaExceeded:
        """The refusal of a batch with at least ``at_least`` new series, beyond the room
        ``begin_batch`` gave (counted like ``admit``'s)."""
        limits = self.settings
        with self._lock:
            now = self._clock()
            usage = self._usage(node, now)
            total = len(usage.series) + at_least
            exc: QuotaExceeded
            if total > limits.max_series:
                exc = QuotaExceeded(
                    Quota.MAX_SERIES,
                    _refusal(
                        node,
                        Quota.MAX_SERIES,
                        f"at least {at_least} new series would make {total}",
                        limits.max_series,
                    ),
                )
            else:
                try:
                    self._check_rate(node, usage, at_least, now)
                except QuotaExceeded as refused:
                    exc = refused
                else:  # the room changed meanwhile (another batch, time): say so, retry
                    exc = self._rate_refusal(node, at_least, self._tokens(usage, now))
            return self._counted(node, usage, exc)

    def _new_series(self, batch: ValidBatch, usage: _NodeUsage) -> list[SeriesKey]:
        """The batch's series the node does not hold yet, checked against the series and label
        value limits."""
        known = usage.series
        keys = list(map(_key_of_sample, batch.samples))
        if usage.last_drops == usage.drops and keys == usage.last_keys:
            return []  # the same series as the last batch, none forgotten since
        if known.issuperset(keys):
            usage.last_keys, usage.last_drops = keys, usage.drops
            return []  # every series known, one pass in C
        new = [k for k in dict.fromkeys(keys) if k not in known]
        limits = self.settings
        if len(known) + len(new) > limits.max_series:
            raise QuotaExceeded(
                Quota.MAX_SERIES,
                _refusal(
                    batch.node,
                    Quota.MAX_SERIES,
                    f"{len(new)} new series would make {len(known) + len(new)}",
                    limits.max_series,
                ),
            )
        added: dict[tuple[str, str], set[str]] = {}
        for key in new:
            self._check_label_values(batch.node, usage, key, added)
        return new

    def _check_label_values(
        self,
        node: str,
        usage: _NodeUsage,
        key: SeriesKey,
        added: dict[tuple[str, str], set[str]],
    ) -> None:
        """Raise when the new series ``key`` takes one of its labels past the distinct values
        one name may have (``added``: the values the batch added so far, updated)."""
        limit = self.settings.max_label_values
        for label, value in key.labels:
            held = usage.label_values.get((key.name, label))
            if held is not None and value in held:
                continue
            values = added.setdefault((key.name, label), set())
            values.add(value)
            count = (len(held) if held else 0) + len(values)
            if count > limit:
                raise QuotaExceeded(
                    Quota.MAX_LABEL_VALUES,
                    _refusal(
                        node,
                        Quota.MAX_LABEL_VALUES,
                        f"{key.name}{{{label}}} would have {count} distinct values "
                        f"(new: {value[:40]!r})",
                        limit,
                    ),
                )

    def check_new_label_values(
        self, node: str, key: SeriesKey, added: dict[tuple[str, str], set[str]]
    ) -> None:
        """``_check_label_values`` for the validator's early check (counted like ``admit``)."""
        with self._lock:
            usage = self._usage(node, self._clock())
            try:
                self._check_label_values(node, usage, key, added)
            except QuotaExceeded as exc:
                raise self._counted(node, usage, exc) from None

    def _check_participants(
        self, node: str, participants: list[ParticipantReport], usage: _NodeUsage, now: float
    ) -> list[tuple[str, str, int]]:
        """The batch's participants the node is not counted for yet, checked against the job
        and participant limits (after forgetting those unreported for the window)."""
        self._expire_participants(usage, now)
        new: dict[tuple[str, str, int], None] = {}
        new_jobs: set[str] = set()
        for p in participants:
            pkey = (p.job, p.role, p.rank)
            if pkey in usage.participants:
                continue
            new[pkey] = None
            if p.job not in usage.jobs:
                new_jobs.add(p.job)
        limits = self.settings
        if len(usage.jobs) + len(new_jobs) > limits.max_jobs:
            raise QuotaExceeded(
                Quota.MAX_JOBS,
                _refusal(
                    node,
                    Quota.MAX_JOBS,
                    f"{len(new_jobs)} new job(s) (e.g. {sorted(new_jobs)[0][:40]!r}) would make "
                    f"{len(usage.jobs) + len(new_jobs)}",
                    limits.max_jobs,
                ),
            )
        if len(usage.participants) + len(new) > limits.max_participants:
            raise QuotaExceeded(
                Quota.MAX_PARTICIPANTS,
                _refusal(
                    node,
                    Quota.MAX_PARTICIPANTS,
                    f"{len(new)} new participant(s) would make {len(usage.participants) + len(new)}",
                    limits.max_participants,
                ),
            )
        return list(new)

    def _check_rate(self, node: str, usage: _NodeUsage, new: int, now: float) -> None:
        if not new:
            return
        limits = self.settings
        if new > limits.new_series_burst:
            # More than the bucket ever holds: this batch can never pass as it is.
            raise QuotaExceeded(
                Quota.NEW_SERIES_BURST,
                _refusal(
                    node,
                    Quota.NEW_SERIES_BURST,
                    f"{new} new series at once",
                    limits.new_series_burst,
                ),
            )
        tokens = self._tokens(usage, now)
        usage.tokens, usage.tokens_at = tokens, now
        if new > tokens:
            raise self._rate_refusal(node, new, tokens)

    def _tokens(self, usage: _NodeUsage, now: float) -> float:
        limits = self.settings
        refill = (now - usage.tokens_at) * limits.new_series_per_second
        return min(float(limits.new_series_burst), usage.tokens + refill)

    def _rate_refusal(self, node: str, new: int, tokens: float) -> NewSeriesRateExceeded:
        rate = self.settings.new_series_per_second
        wait = max(1, math.ceil((new - tokens) / rate))
        return NewSeriesRateExceeded(
            _refusal(
                node,
                Quota.NEW_SERIES_PER_SECOND,
                f"{new} new series now, with {int(tokens)} left of its creation budget",
                rate,
            )
            + f"; retry in {wait} s",
            retry_after=wait,
        )

    def _record(
        self,
        batch: ValidBatch,
        usage: _NodeUsage,
        new_series: list[SeriesKey],
        new_participants: list[tuple[str, str, int]],
        now: float,
    ) -> None:
        usage.tokens -= len(new_series)
        usage.series.update(new_series)
        for key in new_series:
            for label, value in key.labels:
                held = usage.label_values.setdefault((key.name, label), {})
                held[value] = held.get(value, 0) + 1
        fresh = set(new_participants)
        for p in batch.participants:
            pkey = (p.job, p.role, p.rank)
            if pkey in fresh:
                fresh.discard(pkey)
                usage.jobs[p.job] = usage.jobs.get(p.job, 0) + 1
            usage.participants[pkey] = now
            usage.participants.move_to_end(pkey)

    def _expire_participants(self, usage: _NodeUsage, now: float) -> None:
        horizon = now - self.settings.participant_window_seconds
        parts = usage.participants
        while parts:
            pkey, seen = next(iter(parts.items()))
            if seen >= horizon:
                return
            del parts[pkey]
            left = usage.jobs[pkey[0]] - 1
            if left:
                usage.jobs[pkey[0]] = left
            else:
                del usage.jobs[pkey[0]]

    # -- the store forgets ---------------------------------------------------------------------

    def forget_series(self, keys: Iterable[SeriesKey]) -> None:
        """The series store dropped ``keys`` (silent for its window): they count no more."""
        with self._lock:
            for key in keys:
                usage = self._nodes.get(key.node)
                if usage is None or key not in usage.series:
                    continue  # another replica's series (shared window): never counted here
                usage.series.discard(key)
                usage.drops += 1
                for label, value in key.labels:
                    held = usage.label_values.get((key.name, label))
                    if held is None:
                        continue
                    left = held.get(value, 0) - 1
                    if left > 0:
                        held[value] = left
                    else:
                        held.pop(value, None)
                        if not held:
                            del usage.label_values[(key.name, label)]

    # -- read side ----------------------------------------------------------------------------

    def usage(self, node: str) -> list[QuotaUse]:
        """Every limit of ``node`` with its use now and the batches it refused (the node page)."""
        limits = self.settings
        with self._lock:
            now = self._clock()
            u = self._nodes.get(node) or _NodeUsage(tokens=limits.new_series_burst, tokens_at=now)
            self._expire_participants(u, now)
            tokens = self._tokens(u, now)
            cpu_ms = 1000 * max(0.0, self._cpu.spent(u.cpu, now)) if u.cpu is not None else 0.0
            fullest, fullest_n = "", 0
            for (name, label), values in u.label_values.items():
                if len(values) > fullest_n:
                    fullest, fullest_n = f"{name}{{{label}}}", len(values)
            used: list[tuple[Quota, float, float, str]] = [
                (Quota.MAX_SERIES, len(u.series), limits.max_series, ""),
                (Quota.MAX_LABEL_VALUES, fullest_n, limits.max_label_values, fullest),
                (Quota.MAX_JOBS, len(u.jobs), limits.max_jobs, ""),
                (Quota.MAX_PARTICIPANTS, len(u.participants), limits.max_participants, ""),
                # the creation budget spent (the bucket refills at the rate)
                (
                    Quota.NEW_SERIES_BURST,
                    limits.new_series_burst - max(0.0, tokens),
                    limits.new_series_burst,
                    "",
                ),
                (Quota.NEW_SERIES_PER_SECOND, 0.0, limits.new_series_per_second, ""),
                # in ms, as the page shows whole numbers (more than the burst: in debt)
                (
                    Quota.INGEST_CPU_BURST_SECONDS,
                    cpu_ms,
                    1000 * limits.ingest_cpu_burst_seconds,
                    "ms",
                ),
                (Quota.INGEST_CPU_SHARE, 0.0, limits.ingest_cpu_share, ""),
            ]
            return [QuotaUse(q, n, lim, u.refusals.get(q, 0), d) for q, n, lim, d in used]


class BatchCheck:
    """One batch's early checks (``NodeQuotas.begin_batch``): told each series the validator
    finds new in its cache, it raises the refusal as soon as the batch holds one too many."""

    def __init__(self, quotas: NodeQuotas, node: str, room: int) -> None:
        self._quotas, self._node, self._room = quotas, node, room
        self._new = 0
        self._added: dict[tuple[str, str], set[str]] = {}

    def expect_new(self, count: int) -> None:
        if count > self._room:
            self._quotas.refuse_early(self._node, count)

    def new_series(self, key: SeriesKey) -> None:
        usage = self._quotas._nodes.get(self._node)  # noqa: SLF001 - one concept, two classes
        if usage is not None and key in usage.series:
            return  # a series the node holds (the validator's cache had forgotten it)
        self._new += 1
        if self._new > self._room:
            raise self._quotas.refuse_new_series(self._node, self._new)
        if usage is not None:
            self._quotas.check_new_label_values(self._node, key, self._added)
