"""Inference engines (vLLM, SGLang) as rollout participants: health probe and metrics scrape.

``--engine vllm=http://h:8000,role=rollout,rank=0`` (repeatable): every round the agent asks the
engine's ``/health`` and, when it answers, scrapes its ``/metrics``. The engine's own counters
become the job signals a rollout worker would otherwise write into its heartbeat, labelled
``job``, ``role``, ``rank`` and ``engine`` (vllm | sglang):

- ``rollout_engine_up`` 1/0: ``/health`` answered 200 within the timeout. The policy engine's
  ``rollout_engine_down`` detector reads it: an engine that stops answering while the job goes
  on is restarted through the launcher (``restart_role``).
- ``rollout_pending_ratio`` = waiting / (waiting + running) requests (with the counts), the
  golden metric; ``rollout_tokens_generated_total`` and ``rollout_tokens_per_second`` (increase
  of the engine's generation-token counter over the scrape interval); KV-cache usage (0..1) and
  preemptions.

Metric names were checked against the engines' source (``docs/metrics.md`` cites file and
version). Every probe has a timeout, and the engines are probed concurrently, so a hung engine
costs a round at most one timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from agents.collectors.engine_processes import EngineProcessWatch, is_local
from agents.collectors.exposition import ExpositionReader, ExpositionSample, ScrapeError, scrape
from recovery.protocol.samples import Sample, make_sample
from recovery.report import JOB_PATTERN

log = logging.getLogger("rlguard.agent.engines")


@dataclass(frozen=True)
class EngineMetricNames:
    """Where one engine keeps each value we read (full exposition sample names)."""

    running: str
    waiting: str
    generation_tokens: str
    kv_cache_usage: tuple[str, ...]  # first found wins (current name, then the deprecated one)
    preemptions: str
    # finished requests by why they finished (the label ``finish_label``), where the engine
    # counts them: how many ended in an error or were aborted
    finished: str | None = None
    finish_label: str = "finished_reason"
    errored_reasons: tuple[str, ...] = ()
    aborted_reasons: tuple[str, ...] = ()

    @property
    def families(self) -> tuple[str, ...]:
        """Every name read (the reader parses only these families of the page)."""
        finished = (self.finished,) if self.finished else ()
        return (
            self.running,
            self.waiting,
            self.generation_tokens,
            *self.kv_cache_usage,
            self.preemptions,
            *finished,
        )


_VLLM_METRICS = EngineMetricNames(
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    generation_tokens="vllm:generation_tokens_total",
    kv_cache_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    preemptions="vllm:num_preemptions_total",
    # finished_reason: stop, length, abort, error, repetition (vllm/v1/engine FinishReason)
    finished="vllm:request_success_total",
    errored_reasons=("error",),
    aborted_reasons=("abort",),
)

ENGINE_METRICS: dict[str, EngineMetricNames] = {
    # vllm-project/vllm vllm/v1/metrics/loggers.py (PrometheusStatLogger); counters are exposed
    # with prometheus_client's ``_total`` suffix. kv_cache_usage_perc replaced
    # gpu_cache_usage_perc in 0.9; both are read. Every name was checked against a live vLLM
    # 0.32.0 server's /metrics (tests/unit/agents/collectors/expositions/vllm-0.32.0.txt).
    "vllm": _VLLM_METRICS,
    # TRL's `trl vllm-serve` (1.16) runs vLLM's own OpenAI server (`vllm serve` with TRL's
    # worker extension): the same page and process tree, a start-up grace of its own.
    "trl-vllm-serve": _VLLM_METRICS,
    # sgl-project/sglang python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector,
    # TokenizerMetricsCollector): token_usage is the KV pool's used fraction; retracted
    # requests are SGLang's preemptions.
    "sglang": EngineMetricNames(
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        generation_tokens="sglang:generation_tokens_total",
        kv_cache_usage=("sglang:token_usage",),
        preemptions="sglang:num_retracted_requests_total",
    ),
}
_MAX_RANK = 1_000_000


class EngineSpecError(ValueError):
    """An ``--engine`` value that cannot be used; the message names the bad part."""


@dataclass(frozen=True)
class EngineSpec:
    """One engine the agent watches: kind, base URL, and the participant it stands for."""

    kind: str
    url: str
    role: str = "rollout"
    rank: int = 0
    job: str | None = None
    # the engine's API server (the root of its process tree); found by the port it listens on
    # when not given and the engine runs on this node
    pid: int | None = None

    @classmethod
    def parse(cls, text: str) -> EngineSpec:
        """Parse ``KIND=URL[,role=R][,rank=N][,job=J][,pid=P]``; raises :class:`EngineSpecError`."""
        kind, sep, rest = text.partition("=")
        if not sep or not kind:
            raise EngineSpecError(f"expected KIND=URL[,role=R,rank=N,job=J], got {text!r}")
        if kind not in ENGINE_METRICS:
            raise EngineSpecError(
                f"unknown engine {kind!r} in {text!r} (expected one of "
                f"{', '.join(sorted(ENGINE_METRICS))})"
            )
        url, *options = rest.split(",")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineSpecError(f"engine URL must be http:// or https://, got {url!r}")
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise EngineSpecError(f"engine URL has a bad port: {url!r}") from None
        base = url.rstrip("/").removesuffix("/metrics")
        values: dict[str, str] = {}
        for option in options:
            key, eq, value = option.partition("=")
            if not eq or key not in ("role", "rank", "job", "pid"):
                raise EngineSpecError(
                    f"unknown engine option {option!r} in {text!r} "
                    f"(expected role=, rank=, job=, pid=)"
                )
            values[key] = value
        role = values.get("role", "rollout")
        if not JOB_PATTERN.match(role):
            raise EngineSpecError(f"engine role is not a valid identifier: {role!r}")
        job = values.get("job")
        if job is not None and not JOB_PATTERN.match(job):
            raise EngineSpecError(f"engine job is not a valid identifier: {job!r}")
        rank_text = values.get("rank", "0")
        if not rank_text.isdigit() or int(rank_text) > _MAX_RANK:
            raise EngineSpecError(
                f"engine rank must be a whole number from 0 to {_MAX_RANK}, got {rank_text!r}"
            )
        pid_text = values.get("pid")
        if pid_text is not None and (not pid_text.isdigit() or int(pid_text) < 1):
            raise EngineSpecError(
                f"engine pid must be a process id (a whole number above 0), got {pid_text!r}"
            )
        pid = int(pid_text) if pid_text is not None else None
        return cls(kind=kind, url=base, role=role, rank=int(rank_text), job=job, pid=pid)

    @property
    def name(self) -> str:
        """``kind role-rank``, for log lines."""
        return f"{self.kind} {self.role}-{self.rank}"


@dataclass
class _EngineState:
    spec: EngineSpec
    labels: dict[str, str]
    reader: ExpositionReader
    processes: EngineProcessWatch
    down_reason: str | None = None
    metrics_failing: str | None = None
    last_tokens: tuple[float, float] | None = None  # (monotonic time, generation tokens)


class EngineCollector:
    """Probes and scrapes every configured engine once per :meth:`collect`."""

    def __init__(
        self,
        engines: Sequence[EngineSpec],
        *,
        default_job: str,
        timeout: float = 1.0,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
        discover: Callable[[], Sequence[EngineSpec]] | None = None,
    ) -> None:
        self._clock = clock
        self._client = httpx.Client(timeout=timeout, transport=transport)
        self._default_job = default_job
        self._engines = [self._state_for(e) for e in engines]
        # Engines the job announces (agents.collectors.engine_discovery), read every round; an
        # --engine for the same participant wins over an announcement.
        self._discover = discover
        self._discovered: dict[EngineSpec, _EngineState] = {}
        self._pool = ThreadPoolExecutor(
            max_workers=max(4 if discover else 1, len(engines)), thread_name_prefix="engine"
        )

    def _state_for(self, e: EngineSpec) -> _EngineState:
        return _EngineState(
            spec=e,
            labels={
                "job": e.job or self._default_job,
                "role": e.role,
                "rank": str(e.rank),
                "engine": e.kind,
            },
            reader=ExpositionReader(ENGINE_METRICS[e.kind].families),
            processes=_process_watch(e),
        )

    def _current(self) -> list[_EngineState]:
        """The configured engines and those announced now (a rank's new engine replaces its
        predecessor when the announcement is rewritten)."""
        if self._discover is None:
            return self._engines
        fixed = {(s.labels["job"], s.spec.role, s.spec.rank) for s in self._engines}
        found: dict[EngineSpec, _EngineState] = {}
        for spec in self._discover():
            state = self._discovered.get(spec) or self._state_for(spec)
            if (state.labels["job"], spec.role, spec.rank) in fixed or spec in found:
                continue
            if spec not in self._discovered:
                log.info("watching engine %s at %s (announced by the job)", spec.name, spec.url)
            found[spec] = state
        self._discovered = found
        return [*self._engines, *found.values()]

    def close(self) -> None:
        """Stop the probe threads and close the HTTP client."""
        self._pool.shutdown(wait=True)
        self._client.close()

    def collect(self) -> list[Sample]:
        """Probe every engine concurrently; this round's samples."""
        engines = self._current()
        if not engines:
            return []
        out: list[Sample] = []
        for samples in self._pool.map(self._collect_one, engines):
            out.extend(samples)
        return out

    def _collect_one(self, state: _EngineState) -> list[Sample]:
        now = self._clock()
        labels = state.labels
        # The process table first: it answers at once, whatever the probe below waits for.
        out = self._processes(state, now)
        reason = self._probe(state.spec.url + "/health")
        if reason is not None:
            if state.down_reason is None:
                log.warning(
                    "engine %s at %s is not answering: %s", state.spec.name, state.spec.url, reason
                )
            state.down_reason = reason
            state.last_tokens = None
            return [*out, make_sample("rollout_engine_up", 0, now, labels)]
        if state.down_reason is not None:
            log.warning("engine %s at %s answers again", state.spec.name, state.spec.url)
            state.down_reason = None
        out.append(make_sample("rollout_engine_up", 1, now, labels))
        names = ENGINE_METRICS[state.spec.kind]
        try:
            samples = scrape(self._client, state.spec.url + "/metrics", state.reader)
        except ScrapeError as exc:
            if state.metrics_failing is None:
                log.warning("engine %s: metrics not readable: %s", state.spec.name, exc)
            state.metrics_failing = str(exc)
            return out
        if state.metrics_failing is not None:
            log.info("engine %s: metrics readable again", state.spec.name)
            state.metrics_failing = None
        sums = _sum_by_name(samples)

        def add(name: str, value: float) -> None:
            out.append(make_sample(name, value, now, labels))

        running, waiting = sums.get(names.running), sums.get(names.waiting)
        if running is not None:
            add("rollout_engine_requests_running", running)
        if waiting is not None:
            add("rollout_engine_requests_waiting", waiting)
        if running is not None and waiting is not None:
            add("rollout_pending_count", waiting)
            add("rollout_scheduled_count", waiting + running)
            if waiting + running > 0:
                add("rollout_pending_ratio", waiting / (waiting + running))
        kv = [_mean_by_name(samples, n) for n in names.kv_cache_usage if n in sums]
        if kv:
            add("rollout_engine_kv_cache_usage_ratio", kv[0])
        preempted = sums.get(names.preemptions)
        if preempted is not None:
            add("rollout_engine_preemptions_total", preempted)
        tokens = sums.get(names.generation_tokens)
        if tokens is not None:
            add("rollout_tokens_generated_total", tokens)
            self._tokens_per_second(state, tokens, add)
        if names.finished is not None:
            by_reason = _sum_by_label(samples, names.finished, names.finish_label)
            if by_reason:
                add("rollout_engine_requests_finished_total", sum(by_reason.values()))
                errored = sum(by_reason.get(r, 0.0) for r in names.errored_reasons)
                aborted = sum(by_reason.get(r, 0.0) for r in names.aborted_reasons)
                add("rollout_engine_requests_errored_total", errored)
                add("rollout_engine_requests_aborted_total", aborted)
        return out

    def _processes(self, state: _EngineState, now: float) -> list[Sample]:
        """``rollout_engine_process_dead`` per level of the tree seen so far (label
        ``process``) and the engine's uptime, when its processes can be watched from here."""
        view = state.processes.observe()
        if view is None:
            return []
        out = [
            make_sample(
                "rollout_engine_process_dead", int(dead), now, {**state.labels, "process": level}
            )
            for level, dead in view.dead.items()
        ]
        if view.started_at is not None:
            out.append(
                make_sample(
                    "rollout_engine_uptime_seconds",
                    max(0.0, now - view.started_at),
                    now,
                    state.labels,
                )
            )
        return out

    def _tokens_per_second(
        self, state: _EngineState, tokens: float, add: Callable[[str, float], None]
    ) -> None:
        mono = time.monotonic()
        prev = state.last_tokens
        state.last_tokens = (mono, tokens)
        if prev is None or mono <= prev[0] or tokens < prev[1]:
            return  # first scrape, or the engine restarted (its counter went back): no rate yet
        add("rollout_tokens_per_second", (tokens - prev[1]) / (mono - prev[0]))

    def _probe(self, url: str) -> str | None:
        """None when ``url`` answers 200; else why not (one line)."""
        try:
            response = self._client.get(url)
        except httpx.TimeoutException:
            return f"no answer within {self._client.timeout.read} s"
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.status_code != 200:
            return f"HTTP {response.status_code}"
        return None


def _process_watch(spec: EngineSpec) -> EngineProcessWatch:
    parts = urlsplit(spec.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return EngineProcessWatch(
        kind=spec.kind, port=port, pid=spec.pid, local=is_local(parts.hostname or "")
    )


def _sum_by_label(samples: list[ExpositionSample], name: str, label: str) -> dict[str, float]:
    """``name``'s values summed per value of ``label`` (over the engine's other labels)."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name == name:
            key = s.labels.get(label, "")
            out[key] = out.get(key, 0.0) + s.value
    return out


def _sum_by_name(samples: list[ExpositionSample]) -> dict[str, float]:
    """Counts and counters summed over the engine's own labels (model_name, engine index ...):
    a data-parallel vLLM lists one series per engine core."""
    out: dict[str, float] = {}
    for s in samples:
        out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _mean_by_name(samples: list[ExpositionSample], name: str) -> float:
    values = [s.value for s in samples if s.name == name]
    return sum(values) / len(values)
