"""Server settings, read from ``RLGUARD_*`` environment variables.

One ``Settings`` tree, cached by :func:`get_settings`, for the server, the workers and the CLI.
Nested groups (``ingest``, ``policy``, ``series``, ...) are set with a double underscore, e.g.
``RLGUARD_INGEST__MAX_SAMPLES=1000``; two older groups keep their single-underscore names:
``recovery`` (``RLGUARD_RECOVERY_RUN_ROOT``) and ``alerts`` (``RLGUARD_ALERTS_FILE``).

``RLGUARD_POLICY__<PATH>`` override the policy file's thresholds, each named by its path in the
file (``PolicySettings``); the merged policy is what the engine runs and the dashboard draws
(app/runtime.py).

The secret key comes from ``RLGUARD_SECRET_KEY``, else from ``<data_dir>/secret_key`` (written by
``rlguard up``), else it stays the public default, which :meth:`Settings.check_secret` refuses
outside dev mode (``RLGUARD_DEV=1``).
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.core.forwarded import parse_trusted_proxies

log = logging.getLogger("rlguard.config")

DEFAULT_SECRET_KEY = "rlguard-insecure-default-secret"
SECRET_FILE_NAME = "secret_key"


class ConfigError(RuntimeError):
    """A setting has a value the server cannot run with; the message names it."""


PositiveSeconds = Annotated[float, Field(gt=0)]


class _Overrides(BaseModel):
    """A group of ``RLGUARD_POLICY__*`` overrides: a field names its key in the policy file."""

    model_config = ConfigDict(extra="forbid")


class TrainerOverrides(_Overrides):
    idle_timeout_seconds: PositiveSeconds | None = None


class RolloutOverrides(_Overrides):
    stall_timeout_seconds: PositiveSeconds | None = None


class HeartbeatOverrides(_Overrides):
    suspect_seconds: PositiveSeconds | None = None
    confirm_seconds: PositiveSeconds | None = None


class DetectionOverrides(_Overrides):
    trainer: TrainerOverrides = TrainerOverrides()
    rollout: RolloutOverrides = RolloutOverrides()
    heartbeat: HeartbeatOverrides = HeartbeatOverrides()


class RecoveryOverrides(_Overrides):
    rollout_retry_times: Annotated[int, Field(ge=0)] | None = None
    rollout_timeout_sec: PositiveSeconds | None = None


class BoundOverrides(_Overrides):
    healthy: float | None = None
    warning: float | None = None


class GoldenOverrides(_Overrides):
    rollout_pending_ratio: BoundOverrides = BoundOverrides()
    actor_shard_rebuild_count_5m: BoundOverrides = BoundOverrides()
    state_log_write_latency_ms: BoundOverrides = BoundOverrides()


# The groups of PolicySettings that mirror the policy file (app/policy/policy.yaml).
POLICY_FILE_GROUPS = ("tick_seconds", "detection", "recovery", "golden_metrics")

# The names of the previous release, each with its path in the policy file: still read for one
# release, with a warning naming the new variable (``_move_deprecated``).
DEPRECATED_POLICY_NAMES: dict[str, tuple[str, ...]] = {
    "trainer_idle_timeout": ("detection", "trainer", "idle_timeout_seconds"),
    "rollout_stall_timeout": ("detection", "rollout", "stall_timeout_seconds"),
    "heartbeat_suspect_after": ("detection", "heartbeat", "suspect_seconds"),
    "heartbeat_confirm_after": ("detection", "heartbeat", "confirm_seconds"),
    "rollout_retry_times": ("recovery", "rollout_retry_times"),
    "rollout_timeout_sec": ("recovery", "rollout_timeout_sec"),
    **{
        f"severity_thresholds__{metric}_{bound}": ("golden_metrics", metric, bound)
        for metric in GoldenOverrides.model_fields
        for bound in ("healthy", "warning")
    },
}


def _paths(model: type[BaseModel], prefix: str) -> list[str]:
    out: list[str] = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            out.extend(_paths(kind, f"{prefix}{name}."))
        else:
            out.append(prefix + name)
    return out


def policy_variable(path: str) -> str:
    """The environment variable of a policy-file path (``detection.heartbeat.suspect_seconds``
    -> ``RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS``)."""
    return "RLGUARD_POLICY__" + path.upper().replace(".", "__")


class PolicySettings(BaseModel):
    """Overrides of the policy file's thresholds. Each variable is the policy file's path
    (``RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS`` for
    ``detection.heartbeat.suspect_seconds``); unset values keep the file's, set ones replace it
    for the engine and the dashboard alike (app/runtime.py loads the one policy both read, and
    validates it with the policy file's own rules)."""

    model_config = ConfigDict(extra="forbid")  # a misspelt variable is refused, naming it

    tick_seconds: PositiveSeconds | None = None
    detection: DetectionOverrides = DetectionOverrides()
    recovery: RecoveryOverrides = RecoveryOverrides()
    golden_metrics: GoldenOverrides = GoldenOverrides()
    # Not in the policy file: the goodput ledger's assumed checkpoint cadence (app/goodput).
    checkpoint_interval_steps: Annotated[int, Field(gt=0)] = 50
    # Deprecated names (DEPRECATED_POLICY_NAMES), moved to their path once read.
    trainer_idle_timeout: PositiveSeconds | None = None
    rollout_stall_timeout: PositiveSeconds | None = None
    heartbeat_suspect_after: PositiveSeconds | None = None
    heartbeat_confirm_after: PositiveSeconds | None = None
    rollout_retry_times: Annotated[int, Field(ge=0)] | None = None
    rollout_timeout_sec: PositiveSeconds | None = None
    severity_thresholds: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _move_deprecated(self) -> PolicySettings:
        old = {
            name: value
            for name in DEPRECATED_POLICY_NAMES
            if not name.startswith("severity_thresholds__")
            and (value := getattr(self, name)) is not None
        }
        for key, value in self.severity_thresholds.items():
            name = f"severity_thresholds__{key.lower()}"
            if name not in DEPRECATED_POLICY_NAMES:
                raise ValueError(f"severity_thresholds: unknown threshold {key!r}")
            old[name] = value
        for name, value in old.items():
            path = DEPRECATED_POLICY_NAMES[name]
            new = policy_variable(".".join(path))
            group: Any = self
            for part in path[:-1]:
                group = getattr(group, part)
            current = getattr(group, path[-1])
            if current is not None and current != value:
                raise ValueError(
                    f"RLGUARD_POLICY__{name.upper()} ({value}) and {new} ({current}) disagree: "
                    f"set only {new}"
                )
            setattr(group, path[-1], value)
            log.warning(
                "RLGUARD_POLICY__%s is deprecated and goes in the next release: use %s",
                name.upper(),
                new,
            )
            if not name.startswith("severity_thresholds__"):
                setattr(self, name, None)
        self.severity_thresholds = {}
        return self

    def overridden(self) -> dict[str, float]:
        """The set overrides, by their path in the policy file."""
        return dict(_leaves(self.file_overrides()))

    def file_overrides(self) -> dict[str, Any]:
        """The set overrides in the policy file's shape, to merge over the file's data."""
        return _pruned(self.model_dump(include=set(POLICY_FILE_GROUPS), exclude_none=True))


#: Every policy-file path an ``RLGUARD_POLICY__*`` variable may override.
POLICY_OVERRIDE_PATHS: tuple[str, ...] = tuple(
    path for path in _paths(PolicySettings, "") if path.split(".")[0] in POLICY_FILE_GROUPS
)


def _pruned(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` without its empty groups."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            value = _pruned(value)
            if not value:
                continue
        out[key] = value
    return out


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        out.extend(_leaves(value, path) if isinstance(value, dict) else [(path, value)])
    return out


class IngestLimits(BaseModel):
    """Bounds on one ``POST /api/v1/ingest`` batch; anything beyond them is refused whole."""

    max_body_bytes: Annotated[int, Field(gt=0)] = 4 * 1024 * 1024
    max_samples: Annotated[int, Field(gt=0)] = 5000
    max_participants: Annotated[int, Field(ge=0)] = 1024
    max_labels: Annotated[int, Field(ge=0)] = 16
    max_label_name_length: Annotated[int, Field(gt=0)] = 64
    max_label_value_length: Annotated[int, Field(gt=0)] = 128
    max_name_length: Annotated[int, Field(gt=0, le=200)] = 200  # metric_rollup.name column
    # node, agent, job and role columns are 128 characters (role 64): not configurable upward
    max_id_length: Annotated[int, Field(gt=0, le=128)] = 128
    max_fingerprint_keys: Annotated[int, Field(ge=0)] = 128
    max_fingerprint_value_length: Annotated[int, Field(gt=0)] = 512
    # Samples stamped further ahead of the server clock than this are refused: a wrong agent
    # clock would otherwise pin "latest" values and rollup minutes in the future.
    max_future_skew_seconds: Annotated[float, Field(gt=0)] = 600.0
    # A node whose clock is off by at least this much has its stamps moved onto the server's
    # clock (app/ingest/clock_skew.py). NTP keeps healthy clocks within milliseconds; a few
    # seconds of staleness do not matter to detection (samples are judged up to 15 s old),
    # and a request queued on a loaded server must not pass for a wrong clock.
    clock_correct_above_seconds: Annotated[float, Field(gt=0)] = 5.0
    # Dedupe state of agents silent this long is forgotten at server start (agents that restart
    # their sequence use a new agent_id, so old ones would otherwise pile up forever).
    cursor_retention_days: Annotated[float, Field(gt=0)] = 30.0
    # How long a request waits for its batch's durable commit before answering 503.
    commit_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    # After a commit failed because the database's disk is full, new batches are refused at
    # once (503 naming the cause) for this long, then tried again (app/ingest/storage_full.py).
    storage_full_hold_seconds: Annotated[float, Field(gt=0, le=300)] = 5.0
    # Node-token lookups are cached this long; revocation through the API is immediate, a
    # revocation from another process (the CLI) takes effect within this many seconds.
    token_cache_seconds: Annotated[float, Field(ge=0)] = 5.0
    # SQLite only: run a group commit on the event loop when it can take the write lock at once
    # and commits wait (on the disk: wall time less CPU time) under this many milliseconds on
    # average (0 turns it off). Handing a commit to a
    # thread costs more than the commit itself while the loop is busy (GIL hand-offs; see
    # app/ingest/commit/sqlite_loop.py); a slow or locked commit falls back to the thread.
    inline_commit_max_ms: Annotated[float, Field(ge=0, le=200)] = 20.0
    # PostgreSQL (psycopg) only: await group commits on the event loop through an asyncio
    # connection instead of a worker thread, for the same reason (app/ingest/commit/postgres_loop.py).
    # false: every commit on a thread, as before.
    postgres_commits_on_loop: bool = True


class SeriesSettings(BaseModel):
    """In-memory window, Prometheus export and per-minute rollups."""

    window_seconds: Annotated[float, Field(gt=0)] = 900.0
    max_points: Annotated[int, Field(gt=0)] = 1200
    rollup_interval_seconds: Annotated[float, Field(gt=0)] = 15.0
    # A minute is rolled up once the server clock is this far past its end (late batches).
    rollup_grace_seconds: Annotated[float, Field(ge=0)] = 10.0
    rollup_retention_days: Annotated[float, Field(gt=0)] = 30.0
    # Labels kept on the exported /metrics series (node is always kept); see app/metrics.py.
    export_labels: list[str] = ["gpu", "job", "role"]
    # Share the window and participant heartbeats between server replicas through Redis
    # (RLGUARD_REDIS_URL), so that any replica can take ingest: app/series/backend.py.
    shared_window: bool = False
    shared_follow_interval_seconds: Annotated[float, Field(gt=0)] = 0.5


class GoodputSettings(BaseModel):
    """The goodput ledger's assumptions (``RLGUARD_GOODPUT__*``), shown beside its figures."""

    # H800 spot price per GPU-hour, from the seeds' cost-of-a-fault estimate.
    price_per_gpu_hour: Annotated[float, Field(ge=0)] = 2.5
    # Counterfactual: how long a person takes to notice a fault without RLGuard (at night).
    human_detection_delay_seconds: Annotated[float, Field(ge=0)] = 1800.0
    # A node whose GPUs were never reported counts this many.
    gpus_per_node: Annotated[int, Field(ge=1)] = 8
    # Whose step counter is the job's progress.
    trainer_roles: list[str] = ["trainer"]


class DrillSettings(BaseModel):
    """``rlguard drill`` (``RLGUARD_DRILLS__*``, app/drills)."""

    # How long POST /api/v1/drills waits for the node's launcher to answer (inject or refuse)
    # before it answers 202 with the drill still requested.
    answer_wait_seconds: Annotated[float, Field(gt=0, le=120)] = 30.0
    # How long a drill armed for --at-step may wait for that step before it is given up.
    arm_timeout_seconds: Annotated[float, Field(gt=0)] = 1800.0
    # How long after the injection the incident and the recovery are followed for the report.
    follow_timeout_seconds: Annotated[float, Field(gt=0)] = 1200.0
    # How often the follow-up looks (a Celery task on the cluster queue, never blocking one).
    follow_interval_seconds: Annotated[float, Field(gt=0, le=60)] = 2.0


class SilenceSettings(BaseModel):
    """Silences and maintenance windows (``RLGUARD_SILENCES__*``)."""

    # The longest silence, one-off maintenance window or weekly occurrence one may create: a
    # mute nobody remembers should end by itself rather than hide faults for months.
    max_duration_hours: Annotated[float, Field(gt=0)] = 14 * 24.0
    # The longest =~ / !~ pattern a new silence may carry. RE2 matches in linear time, but its
    # cost still grows with the pattern, and every alert is checked against every silence.
    max_regex_chars: Annotated[int, Field(gt=0, le=300)] = 300


class HardeningSettings(BaseModel):
    """Request limits (``RLGUARD_HARDENING__*``): body size, login and ingest rate limits."""

    # Every request body except ingest's (bounded by ``ingest.max_body_bytes``).
    max_request_body_bytes: Annotated[int, Field(gt=0)] = 1024 * 1024
    # Login attempts (POST /api/v1/auth/token and the dashboard's /login) per client address.
    login_attempts_per_minute: Annotated[float, Field(gt=0)] = 10.0
    login_burst: Annotated[int, Field(ge=1)] = 10
    # Login attempts per user name, from any address: bounds guessing one account's password
    # from many addresses. Larger than the per-address budget, so one attacker address locked
    # out does not lock the account's owner out too.
    login_attempts_per_name_per_minute: Annotated[float, Field(gt=0)] = 10.0
    login_name_burst: Annotated[int, Field(ge=1)] = 30
    # Ingest requests per node token: an agent sends about one per second, and its spool
    # replays faster after an outage, hence the burst.
    ingest_requests_per_second: Annotated[float, Field(gt=0)] = 20.0
    ingest_burst: Annotated[int, Field(ge=1)] = 200


class NodeQuotaSettings(BaseModel):
    """What one node (one node token) may create on the server (``RLGUARD_NODE_QUOTAS__*``;
    app/ingest/quotas.py, docs/deploy.md). Defaults fit an 8-GPU node running a few jobs with
    room to spare; a batch that would go beyond one is refused whole and nothing of it is kept."""

    # Series (metric name + labels) of the node in the in-memory window; an 8-GPU node sends
    # ~300 GPU series and ~30 per training process.
    max_series: Annotated[int, Field(ge=1)] = 10_000
    # Jobs and training processes (job, role, rank) the node reported within
    # ``participant_window_seconds``.
    max_jobs: Annotated[int, Field(ge=1)] = 16
    max_participants: Annotated[int, Field(ge=1)] = 256
    # Distinct values of one label of one metric name among the node's series (gpu, rank, xid).
    max_label_values: Annotated[int, Field(ge=1)] = 256
    # Series the node may create per second (sustained), and at once (a fresh agent's first
    # batch: up to ``ingest.max_samples`` samples, each possibly a new series).
    new_series_per_second: Annotated[float, Field(gt=0)] = 50.0
    new_series_burst: Annotated[int, Field(ge=1)] = 5000
    # A participant (and its job) not reported for this long stops counting against the node.
    participant_window_seconds: Annotated[float, Field(gt=0)] = 900.0
    # Incidents about the node the policy opens per minute; beyond it one incident about the
    # flood is opened instead (app/policy/open_budget.py). A quarter of it may open in any 15 s:
    # 80 lets a real failure of an 8-GPU node through at once (the node, its eight GPUs and its
    # eight ranks: 17) without calling it a flood.
    incidents_per_minute: Annotated[int, Field(ge=1)] = 80
    # The event loop's CPU time the node's batches may take (app/ingest/cpu_share.py): this
    # fraction of one core sustained, and this many seconds at once; a node in debt gets 429
    # before its body is read. An 8-GPU agent's batch a second takes well under 1%. The burst
    # need not hold a large batch (a batch is charged after it ran: one of any size passes a
    # node not in debt); a smaller one stops a flood's refused batches sooner (cpu_share.py).
    ingest_cpu_share: Annotated[float, Field(gt=0, le=1)] = 0.02
    ingest_cpu_burst_seconds: Annotated[float, Field(ge=0)] = 0.1


class AutomationSettings(BaseModel):
    """Guard-rails that are the deployment's call rather than the policy's
    (``RLGUARD_AUTOMATION__DRY_RUN=1``): under dry run incidents and plans are made and shown
    but no action runs (app/guardrails/gate.py), e.g. for a first week beside a live cluster."""

    dry_run: bool = False


class DashboardSettings(BaseModel):
    """The dashboard (``RLGUARD_DASHBOARD__*``; docs/deploy.md)."""

    # Above this many nodes the Overview shows the fleet view (a GPU heat map, filters, pages,
    # parts loaded lazily) instead of one card with sparklines per node: 64 cards are about
    # 150 KiB of HTML and a few dozen ms; 1,000 cards were 2 MiB and 0.4 s (benchmarks/dashboard.py).
    fleet_view_above_nodes: Annotated[int, Field(ge=0)] = 64


class ServerLimits(BaseModel):
    """How the HTTP server treats slow and numerous clients (``RLGUARD_SERVER__*``; see
    app/core/http_server.py and docs/deploy.md)."""

    # A request's headers must be complete this long after the connection (or the request's
    # first byte); a slower client gets 408 and is disconnected.
    header_timeout_seconds: Annotated[float, Field(gt=0, le=300)] = 10.0
    # Open connections plus requests in progress; beyond it, a request is answered 503 at once.
    limit_concurrency: Annotated[int, Field(ge=1)] = 1000
    # An idle keep-alive connection is closed after this many seconds.
    keep_alive_seconds: Annotated[int, Field(ge=1, le=300)] = 5
    # Connections one client address (an IPv6 /64) may hold; a newer one first closes that
    # address's oldest connection still waiting for a request, and is refused (429) only when
    # all of them are busy. Trusted proxies are not capped (app/core/client_connections.py).
    max_connections_per_client: Annotated[int, Field(ge=1)] = 128
    # On SIGTERM, requests in progress get this long to finish before they are cancelled...
    graceful_shutdown_seconds: Annotated[int, Field(ge=0, le=300)] = 10
    # ...and the process exits after this long at the latest, whatever still runs (a busy
    # database, a long policy tick): the stacks of every thread go to stderr, exit status 1.
    shutdown_deadline_seconds: Annotated[float, Field(gt=0, le=600)] = 25.0

    @model_validator(mode="after")
    def _deadline_after_grace(self) -> ServerLimits:
        if self.shutdown_deadline_seconds <= self.graceful_shutdown_seconds:
            raise ValueError(
                f"shutdown_deadline_seconds ({self.shutdown_deadline_seconds:g}) must be above "
                f"graceful_shutdown_seconds ({self.graceful_shutdown_seconds})"
            )
        return self


class RecoverySettings(BaseSettings):
    """The recovery workers and the scheduler (``RLGUARD_RECOVERY_<NAME>``, one underscore)."""

    model_config = SettingsConfigDict(env_prefix="RLGUARD_RECOVERY_", extra="ignore")

    # Where a job's run directory is: <run_root>/<job>. Default: <data_dir>/runs.
    run_root: Path | None = None
    # Executable called for restart_role / restart_job / reschedule_batches / restores:
    # ``<launcher> <action> --job J [--node N] [--role R] [--rank K] [--extra JSON]``.
    launcher: str | None = None
    launcher_timeout: Annotated[float, Field(gt=0)] = 120.0
    # Policy file (default: the shipped app/policy/policy.yaml).
    policy_file: Path | None = None
    # A worker holds an action this long; the task's hard time limit stays below it.
    action_lease_seconds: Annotated[float, Field(ge=5)] = 180.0
    max_attempts: Annotated[int, Field(ge=1)] = 5
    # The outbox re-sends an action not started this long after it was sent.
    redispatch_after_seconds: Annotated[float, Field(gt=0)] = 30.0
    dispatch_interval_seconds: Annotated[float, Field(gt=0)] = 2.0
    # Redis broker: an unacknowledged task comes back after this (above the longest task).
    visibility_timeout_seconds: Annotated[float, Field(gt=0)] = 600.0
    broker_timeout_seconds: Annotated[float, Field(gt=0)] = 3.0
    # Scheduler lease (only one server replica runs the policy tick and the dispatcher).
    lease_seconds: Annotated[float, Field(gt=0)] = 10.0
    retention_days: Annotated[float, Field(gt=0)] = 90.0
    # Queues the embedded worker of `rlguard up` consumes besides `cluster` (comma separated
    # node names; default: this machine's host name).
    embedded_nodes: str | None = None

    @property
    def task_time_limit(self) -> float:
        """Hard limit of one task run: well inside the lease, so a stuck task is killed before
        another worker may take its action over."""
        return self.action_lease_seconds * 0.8


class AlertFileSettings(BaseSettings):
    """Where the alert channels are (``RLGUARD_ALERTS_FILE``, ``RLGUARD_ALERTS_EXTERNAL_BASE_URL``;
    read by app/alerts/settings.py)."""

    model_config = SettingsConfigDict(env_prefix="RLGUARD_ALERTS_", extra="ignore")

    file: Path | None = None
    external_base_url: str | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RLGUARD_", env_nested_delimiter="__", extra="ignore"
    )

    dev: bool = False
    data_dir: Path = Path("data")
    database_url: str | None = None
    redis_url: str | None = None
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    secret_key: str = DEFAULT_SECRET_KEY
    log_level: str = "info"
    # Mounts /bench/baseline-ingest (orjson.loads + list.extend) for benchmarks/ingest.py only.
    bench_endpoints: bool = False
    # Reverse proxies whose X-Forwarded-For / -Proto are believed (addresses or CIDR networks,
    # comma-separated in the environment; `rlguard server --trusted-proxy`). None by default:
    # app/core/forwarded.py.
    trusted_proxies: Annotated[list[str], NoDecode] = []
    # SQLite durability: FULL fsyncs every commit (acknowledged batches survive power loss).
    sqlite_synchronous: str = "FULL"

    ingest: IngestLimits = IngestLimits()
    series: SeriesSettings = SeriesSettings()
    policy: PolicySettings = PolicySettings()
    hardening: HardeningSettings = HardeningSettings()
    server: ServerLimits = ServerLimits()
    goodput: GoodputSettings = GoodputSettings()
    automation: AutomationSettings = AutomationSettings()
    silences: SilenceSettings = SilenceSettings()
    drills: DrillSettings = DrillSettings()
    dashboard: DashboardSettings = DashboardSettings()
    node_quotas: NodeQuotaSettings = NodeQuotaSettings()
    # Their own prefixes (RLGUARD_RECOVERY_*, RLGUARD_ALERTS_*), kept from before they joined
    # this tree: each reads its variables itself.
    recovery: RecoverySettings = Field(default_factory=RecoverySettings)
    alerts: AlertFileSettings = Field(default_factory=AlertFileSettings)
    # RLGUARD_POLICY_SCHEDULER=0: the server runs no policy tick, outbox or approvals (tests,
    # read-only replicas); the dashboard still reads the loaded policy.
    policy_scheduler: bool = True

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxy_list(cls, v: object) -> object:
        if isinstance(v, str):
            v = [part for part in v.split(",") if part.strip()]
        if isinstance(v, list | tuple):
            return [str(n) for n in parse_trusted_proxies(str(p) for p in v)]
        return v

    @field_validator("sqlite_synchronous")
    @classmethod
    def _known_sync_mode(cls, v: str) -> str:
        if v.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"sqlite_synchronous must be OFF|NORMAL|FULL|EXTRA, got {v!r}")
        return v.upper()

    @model_validator(mode="after")
    def _derive_defaults(self) -> Settings:
        if self.database_url is None:
            self.database_url = f"sqlite:///{self.data_dir / 'rlguard.db'}"
        if self.secret_key == DEFAULT_SECRET_KEY:
            secret_file = self.data_dir / SECRET_FILE_NAME
            if secret_file.is_file():
                self.secret_key = secret_file.read_text().strip() or DEFAULT_SECRET_KEY
        return self

    @property
    def db_url(self) -> str:
        assert self.database_url is not None  # set by _derive_defaults
        return self.database_url

    @property
    def secret_file(self) -> Path:
        return self.data_dir / SECRET_FILE_NAME

    def check_shared_window(self) -> None:
        if self.series.shared_window and not self.redis_url:
            raise ConfigError(
                "RLGUARD_SERIES__SHARED_WINDOW=true needs RLGUARD_REDIS_URL (the shared window "
                "lives in Redis)"
            )

    def check_secret(self) -> None:
        """Refuse the public default secret unless dev mode is on."""
        if self.secret_key == DEFAULT_SECRET_KEY and not self.dev:
            raise ConfigError(
                "RLGUARD_SECRET_KEY is the built-in default; set it (or run `rlguard up`, which "
                f"generates {self.secret_file}), or set RLGUARD_DEV=1 for development"
            )
        if len(self.secret_key) < 16 and not self.dev:
            raise ConfigError("RLGUARD_SECRET_KEY is shorter than 16 characters")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
