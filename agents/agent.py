"""The agent's main loop: collect every ``interval``, spool the batch, let the sender deliver it.

One round: NVML samples, job signals from the run directory, the agent's own health samples,
and the environment fingerprint when it is due; then one ingest body (split when it would exceed
``max_samples_per_batch``) appended to the spool. The sender thread delivers independently, so
a slow or dead server never delays sampling.

SIGTERM (or SIGINT): the current round is collected and spooled, the sender gets what is left of
``shutdown_grace`` to deliver, and the process exits; whatever is not delivered stays in the spool
for the next start. The whole shutdown stays within 5 s.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import orjson

from agents.collectors.dcgm import DEFAULT_DCGM_URL, DcgmExporterCollector
from agents.collectors.engine_discovery import AnnouncedEngines
from agents.collectors.engines import EngineCollector, EngineSpec
from agents.collectors.gpu_source import GpuSource
from agents.collectors.job import JobCollector
from agents.collectors.nvml import NvmlCollector
from agents.collectors.slurm import SlurmNodeCollector
from agents.fake_nvml import FakeNVML
from agents.fingerprint import DEFAULT_PACKAGES, collect_fingerprint
from agents.sender import Sender
from agents.simulate import apply_fault_files
from agents.spool import Spool, SpoolError
from recovery.fsio import replace_file
from recovery.protocol.samples import Sample, make_sample
from recovery.report import safe_job_name

log = logging.getLogger("rlguard.agent")

STATUS_FILENAME = "status.json"
_FINGERPRINT_CHECK_S = 60.0  # how often the environment is re-read for changes
_MAX_PARTICIPANTS_PER_BATCH = 1000  # the server refuses more than 1024 by default


@dataclass
class AgentConfig:
    """Everything the agent needs; ``python -m agents`` builds it from the command line."""

    server: str
    token: str
    node: str
    run_dir: Path
    spool_dir: Path
    interval: float = 1.0
    simulate_gpus: int = 0
    spool_max_bytes: int = 256 * 1024 * 1024
    record: Path | None = None
    fingerprint_packages: tuple[str, ...] = DEFAULT_PACKAGES
    fingerprint_resend_s: float = 300.0
    max_samples_per_batch: int = 4000
    shutdown_grace: float = 3.0
    spool_fsync: bool = True
    backoff_max: float = 15.0
    extra: dict[str, Any] = field(default_factory=dict)
    # "nvml" (default) or "dcgm-exporter": scrape dcgm_url instead of calling NVML.
    gpu_source: str = "nvml"
    dcgm_url: str = DEFAULT_DCGM_URL
    engines: tuple[EngineSpec, ...] = ()
    scrape_timeout: float = 1.0
    # The node's name in Slurm: ask Slurm every 10 s whether it is DOWN/DRAIN (None: do not).
    slurm_node: str | None = None
    # A Ray cluster's actors as participants (--ray auto|ADDRESS, integrations.ray): the
    # preset maps actor classes to roles; ray_job names the job (default: from Ray's jobs).
    ray_address: str | None = None
    ray_preset: str = "verl"
    ray_job: str | None = None
    ray_interval: float = 1.0
    # verl's file logger (VERL_FILE_LOGGER_PATH) followed for its training signals.
    verl_log: Path | None = None


def default_spool_dir(node: str) -> Path:
    """``$XDG_STATE_HOME/rlguard/agent-<node>`` (``~/.local/state/...`` when unset)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rlguard" / f"agent-{node}"


class Agent:
    """One node agent.

    ``nvml`` overrides the NVML backend, ``clock`` the wall clock and ``transport`` the HTTP
    transport (all for tests); by default the real ``pynvml`` (or the simulated NVML with
    ``simulate_gpus``), ``time.time`` and the network.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        nvml: Any = None,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self.fake: FakeNVML | None = None
        self.gpus: GpuSource
        if config.gpu_source == "dcgm-exporter":
            self.gpus = DcgmExporterCollector(
                config.dcgm_url, timeout=config.scrape_timeout, clock=clock
            )
        elif nvml is None:
            if config.simulate_gpus > 0:
                self.fake = FakeNVML(config.simulate_gpus, clock=clock)
                nvml = self.fake
            else:
                import pynvml

                nvml = pynvml
        elif isinstance(nvml, FakeNVML):
            self.fake = nvml
        if config.gpu_source != "dcgm-exporter":
            self.gpus = NvmlCollector(nvml, simulated=config.simulate_gpus > 0, clock=clock)
        self.jobs = JobCollector(config.run_dir, clock=clock)
        self.slurm = (
            SlurmNodeCollector(config.slurm_node, clock=clock) if config.slurm_node else None
        )
        default_job = safe_job_name(config.run_dir.resolve().name)
        self.engines = EngineCollector(
            config.engines,
            default_job=default_job,
            timeout=config.scrape_timeout,
            clock=clock,
            discover=AnnouncedEngines(config.run_dir, default_job),
        )
        self.ray: Any = None
        self.verl: Any = None
        self._attach_ray(config, clock)
        self.spool = Spool(
            config.spool_dir,
            node=config.node,
            max_bytes=config.spool_max_bytes,
            fsync=config.spool_fsync,
        )
        self.sender = Sender(
            self.spool,
            url=config.server,
            token=config.token,
            backoff_max=config.backoff_max,
            clock=clock,
            transport=transport,
        )
        self._stop = threading.Event()
        self._fingerprint_hash: str | None = None
        self._fingerprint_sent_at = float("-inf")
        self._fingerprint_checked_at = float("-inf")
        self._record = open(config.record, "ab") if config.record else None  # noqa: SIM115
        self.rounds = 0
        self.round_errors = 0
        self.started_at = clock()
        self._spool_failing = False

    def _attach_ray(self, config: AgentConfig, clock: Callable[[], float]) -> None:
        """The Ray collector and verl's log tail, imported only when asked for; a bad preset or
        a missing ray is said once and leaves the rest of the agent running."""
        job = config.ray_job or safe_job_name(config.run_dir.resolve().name)
        if config.verl_log is not None:
            from integrations.ray.verl_log import VerlLogTail

            self.verl = VerlLogTail(config.verl_log, job=job, clock=clock)
        if config.ray_address is None:
            return
        try:
            from integrations.ray.collector import RayCollector
            from integrations.ray.presets import PresetError, load_preset
        except ImportError as exc:  # pragma: no cover - the package ships with the agent
            log.error("--ray: the Ray integration cannot be imported (%s): actors not watched", exc)
            return
        try:
            preset = load_preset(config.ray_preset)
        except PresetError as exc:
            log.error("--ray-preset: %s; Ray actors are not watched", exc)
            return
        self.ray = RayCollector(
            preset,
            address=config.ray_address,
            job_name=config.ray_job,
            interval=config.ray_interval,
            timeout=max(1.0, config.scrape_timeout),
            clock=clock,
        )

    @property
    def nvml(self) -> GpuSource:
        """The GPU source (NVML unless ``gpu_source`` is dcgm-exporter); the older name."""
        return self.gpus

    def request_stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """Ask the loop to finish its round and shut down (safe to call from a signal handler)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the agent cleanly."""
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def run(self) -> int:
        """Run until stopped; returns the process exit code."""
        self.nvml.start()
        self.sender.start()
        if self.ray is not None:
            self.ray.start()
        log.info(
            "agent %s for node %s: server %s, run dir %s, spool %s",
            self.spool.agent_id,
            self.config.node,
            self.config.server,
            self.config.run_dir,
            self.config.spool_dir,
        )
        next_round = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    self.round()
                except Exception:
                    # A bug in one round must not end the monitoring of the node: log it with its
                    # traceback, count it, and sample again at the next interval.
                    self.round_errors += 1
                    log.exception("round %d failed", self.rounds + 1)
                next_round += self.config.interval
                delay = next_round - time.monotonic()
                if delay < 0:  # fell behind (a very slow disk): do not try to catch up in a burst
                    next_round = time.monotonic()
                    delay = 0
                self._stop.wait(delay)
        finally:
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        """Spool the current round, give the sender the grace period, stop, write the status."""
        deadline = time.monotonic() + self.config.shutdown_grace
        self.round()
        # While deliveries succeed, let the sender empty the spool within the grace period; with
        # the server down there is no point waiting: the next start replays the spool.
        while (
            time.monotonic() < deadline - 0.2 and self.sender.healthy and self.spool.stats().batches
        ):
            time.sleep(0.05)
        self.sender.stop(timeout=max(0.1, deadline - time.monotonic()))
        self.write_status()
        self.spool.close()
        self.nvml.close()
        self.engines.close()
        if self.ray is not None:
            self.ray.close()
        if self._record is not None:
            self._record.close()
            self._record = None
        stats = self.spool.stats()
        log.info(
            "agent stopped: %d batch(es), %d sample(s) left in the spool for the next start",
            stats.batches,
            stats.samples,
        )

    def round(self) -> None:
        """Collect once and spool the result (one or more ingest bodies)."""
        if self.fake is not None:
            apply_fault_files(self.config.run_dir, self.fake)
        now = self._clock()
        samples: list[Sample] = self.nvml.collect()
        job_samples, participants = self.jobs.collect()
        samples.extend(job_samples)
        samples.extend(self.engines.collect())
        if self.slurm is not None:
            samples.extend(self.slurm.collect())
        if self.verl is not None:
            samples.extend(self.verl.collect())
        if self.ray is not None:
            ray_samples, ray_participants = self.ray.collect()
            samples.extend(ray_samples)  # the same shapes (recovery.protocol.samples)
            if self.verl is not None and self.verl.step is not None:
                # Ray knows no step: verl's log does (the policy judges first steps apart).
                for p in ray_participants:
                    if p.job == self.verl.labels["job"]:
                        p.step = self.verl.step
            participants.extend(ray_participants)
        samples.extend(self._own_samples(now))
        fingerprint = self._fingerprint_if_due(now)
        limit = self.config.max_samples_per_batch
        plimit = _MAX_PARTICIPANTS_PER_BATCH
        count = max(1, -(-len(samples) // limit), -(-len(participants) // plimit))
        for index in range(count):
            body: dict[str, Any] = {
                "agent_id": self.spool.agent_id,
                "node": self.config.node,
                "samples": samples[index * limit : (index + 1) * limit],
                "participants": participants[index * plimit : (index + 1) * plimit],
                "fingerprint": fingerprint if index == 0 else None,
            }
            try:
                seq = self.spool.append(body)
            except SpoolError as exc:
                if not self._spool_failing:
                    log.error("round lost: %s", exc)
                self._spool_failing = True
                continue
            if self._spool_failing:
                log.warning("spool writable again")
                self._spool_failing = False
            if self._record is not None:
                try:
                    self._record.write(orjson.dumps({**body, "seq": seq, "sent_at": now}) + b"\n")
                    self._record.flush()
                except OSError as exc:
                    log.error("recording to %s stopped: %s", self.config.record, exc)
                    self._record.close()
                    self._record = None
        self.rounds += 1
        self.write_status()

    def _fingerprint_if_due(self, now: float) -> dict[str, str] | None:
        """The fingerprint when it is new, changed, or not sent for ``fingerprint_resend_s``."""
        if now - self._fingerprint_checked_at < _FINGERPRINT_CHECK_S:
            return None
        self._fingerprint_checked_at = now
        fp = collect_fingerprint(
            self.config.fingerprint_packages, driver=self.nvml.driver_versions()
        )
        same = fp["hash"] == self._fingerprint_hash
        if same and now - self._fingerprint_sent_at < self.config.fingerprint_resend_s:
            return None
        if not same and self._fingerprint_hash is not None:
            log.warning(
                "environment fingerprint changed: %s -> %s", self._fingerprint_hash, fp["hash"]
            )
        self._fingerprint_hash = fp["hash"]
        self._fingerprint_sent_at = now
        return fp

    def _own_samples(self, now: float) -> list[Sample]:
        st = self.spool.stats()
        sent = self.sender.stats
        source_up = "agent_dcgm_exporter_up" if self.config.gpu_source != "nvml" else None
        out = [
            make_sample(
                source_up or "agent_nvml_available", 1 if self.nvml.available else 0, now, {}
            ),
            make_sample("agent_gpus_monitored", self.nvml.gpu_count, now, {}),
            make_sample("agent_spool_bytes", st.bytes, now, {}),
            make_sample("agent_spool_batches", st.batches, now, {}),
            make_sample("agent_batches_sent_total", sent.batches_sent, now, {}),
            make_sample("agent_send_failures_total", sent.send_failures, now, {}),
        ]
        for reason, count in sorted(st.dropped.items()):
            out.append(make_sample("agent_dropped_samples_total", count, now, {"reason": reason}))
        return out

    def status(self) -> dict[str, Any]:
        """The agent's health as ``--status`` prints it."""
        st = self.spool.stats()
        sent = self.sender.stats
        return {
            "agent_id": self.spool.agent_id,
            "node": self.config.node,
            "pid": os.getpid(),
            "server": self.config.server,
            "started_at": self.started_at,
            "updated_at": self._clock(),
            "rounds": self.rounds,
            "round_errors": self.round_errors,
            "nvml_available": self.nvml.available,
            "nvml_unavailable_reason": self.nvml.unavailable_reason,
            "gpus": self.nvml.gpu_count,
            "simulated": self.fake is not None,
            "last_send_ok": sent.last_send_ok,
            "last_error": sent.last_error,
            "batches_sent": sent.batches_sent,
            "duplicates": sent.duplicates,
            "send_failures": sent.send_failures,
            "spool_batches": st.batches,
            "spool_bytes": st.bytes,
            "spool_samples": st.samples,
            "spool_max_bytes": self.spool.max_bytes,
            "dropped": st.dropped,
            "produced_samples": st.produced_samples,
            "acked_samples": st.acked_samples,
        }

    def write_status(self) -> None:
        """Replace ``<spool_dir>/status.json`` (read by ``--status``); no fsync: it is advisory."""
        path = self.config.spool_dir / STATUS_FILENAME
        try:
            replace_file(path, orjson.dumps(self.status(), option=orjson.OPT_INDENT_2), sync=False)
        except OSError as exc:
            # Advisory only: a full disk must not stop the sampling; the spool logs its own errors.
            log.debug("status file %s not written: %s", path, exc)
