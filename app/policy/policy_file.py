"""Loading and validating the policy file (``policy.yaml``).

The file is data, not code: thresholds, tier rules, escalation and the Alertmanager mapping. A
mistake in it must stop the server at start with a message that names the bad key, not surface
as a wrong decision at three in the morning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.policy.exit_causes import ExitCauseCatalogueError, catalogue_rules
from app.policy.plans import ActionName
from app.policy.shipped_rules import DEFAULT_POLICY_PATH as DEFAULT_POLICY_PATH  # re-exported
from app.policy.shipped_rules import with_shipped_rules
from app.policy.signals import FaultKind, FaultSignal, Tier
from app.policy.xid_catalog import XidBucket, bucket_of
from recovery.protocol import metric_names as m

GOLDEN_METRICS = (
    m.ROLLOUT_PENDING_RATIO,
    m.ACTOR_SHARD_REBUILD_COUNT_5M,
    m.STATE_LOG_WRITE_LATENCY_MS,
)


class PolicyFileError(ValueError):
    """The policy file is missing, unreadable or invalid; the message names the bad key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GoldenMetricRule(_Strict):
    healthy: float
    warning: float
    inclusive: bool = False
    breach_seconds: float = Field(ge=0)
    kind: FaultKind

    def breaches(self, value: float) -> bool:
        return value >= self.warning if self.inclusive else value > self.warning

    def unhealthy(self, value: float) -> bool:
        """Above healthy (or breaching): inside a breach, such a sample does not end it."""
        return value > self.healthy or self.breaches(value)

    @model_validator(mode="after")
    def _healthy_below_warning(self) -> GoldenMetricRule:
        if self.healthy > self.warning:
            raise ValueError(f"healthy ({self.healthy}) must not exceed warning ({self.warning})")
        return self


class TrainerDetection(_Strict):
    roles: tuple[str, ...] = ("trainer",)
    active_phases: tuple[str, ...] = ("TRAIN",)
    idle_timeout_seconds: float = Field(default=300, gt=0)
    idle_utilization_ratio: float = Field(default=0.05, ge=0, le=1)
    # train_hang (app/policy/detectors/hang.py): the step stuck for max(hang_min_seconds,
    # hang_step_factor x median step time), counted only in hang_phases.
    hang_phases: tuple[str, ...] = ("ROLLOUT", "TRAIN")
    hang_min_seconds: float = Field(default=120, gt=0)
    hang_step_factor: float = Field(default=10, ge=1)
    hang_min_steps: int = Field(default=3, ge=1)
    # train_hang before the pace is known: a first step (after a start or a restart, counted
    # in hang_phases from the end of the start-up grace) longer than this per role (a job may
    # declare its own: heartbeat API, rlguard launch --first-step-budget).
    first_step_budget_seconds: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = (
        Field(default_factory=lambda: {"trainer": 420.0})
    )
    default_first_step_budget_seconds: float = Field(default=420.0, gt=0, allow_inf_nan=False)

    def first_step_budget(self, role: str) -> float:
        return self.first_step_budget_seconds.get(role, self.default_first_step_budget_seconds)


class RolloutDetection(_Strict):
    roles: tuple[str, ...] = ("rollout",)
    stall_timeout_seconds: float = Field(default=60, gt=0)


GraceSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class EngineDetection(_Strict):
    """Inference engines (app/policy/detectors/inference_engines.py; policy.yaml says why each
    number is what it is)."""

    # rollout_engine_down: the health probe failing this long (no process seen from the node).
    down_seconds: float = Field(default=30, gt=0)
    # rollout_engine_hung: the probe failing this long while every process of the tree lives.
    hung_seconds: float = Field(default=10, gt=0)
    # rollout_engine_wedged: requests running or waiting, /health 200, no token this long.
    wedged_seconds: float = Field(default=30, gt=0)
    # rollout_engine_requests_failing: within the window, at least min_requests finished in an
    # error or aborted, and they are at least failed_ratio of all finished.
    failing_window_seconds: float = Field(default=30, gt=0)
    failing_min_requests: int = Field(default=5, ge=1)
    failing_ratio: float = Field(default=0.25, gt=0, le=1)
    # rollout_engine_preemption_storm: at least preemptions_min preemptions within the window.
    preemption_window_seconds: float = Field(default=60, gt=0)
    preemptions_min: int = Field(default=50, ge=1)
    # Start-up grace per engine kind (label engine), from its API server's start, until it
    # first answers: its probes failing while it loads and compiles are not a fault.
    startup_grace_seconds: dict[str, GraceSeconds] = Field(
        default_factory=lambda: {"vllm": 300.0, "sglang": 360.0, "trl-vllm-serve": 300.0}
    )
    default_startup_grace_seconds: GraceSeconds = 300.0

    def grace_seconds(self, kind: str) -> float:
        return self.startup_grace_seconds.get(kind, self.default_startup_grace_seconds)


class HeartbeatDetection(_Strict):
    suspect_seconds: float = Field(default=15, gt=0)
    confirm_seconds: float = Field(default=60, gt=0)
    finished_phases: tuple[str, ...] = ("DONE", "STOPPED", "FINISHED")
    # A participant in one of these phases is known to be gone: its launcher saw the process
    # exit (waitpid) and said so. That is certain, unlike a silent heartbeat, so it is lost at
    # once instead of after suspect + confirm.
    # RAY_DEAD / RAY_RESTARTING: Ray itself reports the actor dead or restarting (agent --ray).
    exited_phases: tuple[str, ...] = ("EXITED", "RAY_DEAD", "RAY_RESTARTING")

    @model_validator(mode="after")
    def _exited_is_not_finished(self) -> HeartbeatDetection:
        both = sorted(set(self.finished_phases) & set(self.exited_phases))
        if both:
            raise ValueError(f"phase(s) {both} cannot be both finished and exited")
        return self

    @model_validator(mode="after")
    def _confirm_after_suspect(self) -> HeartbeatDetection:
        if self.confirm_seconds < self.suspect_seconds:
            raise ValueError(
                f"confirm_seconds ({self.confirm_seconds}) must not be shorter than "
                f"suspect_seconds ({self.suspect_seconds})"
            )
        return self


class StartupDetection(_Strict):
    """Start-up grace (issue 20): a participant in one of ``phases`` (its launcher started it
    and it has not reported for itself yet), or within ``startup_grace_seconds[role]`` of the
    moment it was first seen in one, is not judged for silence or idleness. One still in such
    a phase after its grace never sent its first heartbeat: heartbeat_lost. A role without an
    entry gets ``default_grace_seconds``."""

    phases: tuple[str, ...] = ("STARTING",)
    startup_grace_seconds: dict[str, GraceSeconds] = Field(
        default_factory=lambda: {"trainer": 120.0, "rollout": 600.0}
    )
    default_grace_seconds: GraceSeconds = 120.0

    def grace_seconds(self, role: str) -> float:
        return self.startup_grace_seconds.get(role, self.default_grace_seconds)


class NodeDetection(_Strict):
    several_lost_min: int = Field(default=2, ge=2)


_HARDWARE_BUCKETS = (
    XidBucket.RESET_GPU,
    XidBucket.RESTART_BM,
    XidBucket.RESTART_VM,
    XidBucket.CONTACT_SUPPORT,
    XidBucket.WORKFLOW_XID_48,
    XidBucket.WORKFLOW_NVLINK_ERR,
    XidBucket.WORKFLOW_NVLINK5_ERR,
)


class CorrelatedGpuFaults(_Strict):
    """Several GPUs of one node failing together are one node-level incident
    (``node_gpus_failed``, app/policy/correlated.py): at least ``min_gpus`` GPUs (None: every
    GPU the node reports; never fewer than 2) with the same failure begun within
    ``window_seconds`` of each other. A GPU counts when it is lost or has an XID of one of
    ``xid_buckets`` (the GPU or the node needs service: an application error on every GPU is
    the job's own bug).
    A burst of two or more GPUs still below ``min_gpus`` waits ``settle_seconds`` for the rest
    of the node before its GPUs open incidents of their own."""

    window_seconds: float = Field(default=60, gt=0)
    min_gpus: int | None = Field(default=None, ge=2)
    # a burst of two or more GPUs below min_gpus waits this long for the rest of the node
    settle_seconds: float = Field(default=5, ge=0)
    xid_buckets: tuple[XidBucket, ...] = _HARDWARE_BUCKETS


class GpuDetection(_Strict):
    # XIDs whose gpu_xid plan may drain the node (drain_node, always approved first); none by
    # default: a drain takes the machine from every job of the cluster.
    drain_xids: tuple[int, ...] = ()
    # XIDs of these buckets (app/policy/xid_catalog.py) open no incident.
    ignore_xid_buckets: tuple[XidBucket, ...] = (XidBucket.IGNORE, XidBucket.WORKFLOW_XID_45)
    event_hold_seconds: float = Field(default=120, gt=0)
    throttle_sustain_seconds: float = Field(default=60, gt=0)
    correlated: CorrelatedGpuFaults = CorrelatedGpuFaults()


class StorageDetection(_Strict):
    error_window_seconds: float = Field(default=60, gt=0)


class EnvDriftDetection(_Strict):
    ignore_keys: tuple[str, ...] = ()


class ClockDetection(_Strict):
    # clock_skew (app/policy/detectors/clock_skew.py): a node's clock off by at least skew_seconds
    # for sustain_seconds.
    skew_seconds: float = Field(default=10, gt=0)
    sustain_seconds: float = Field(default=60, ge=0)


class StragglerDetection(_Strict):
    """Stragglers (app/policy/detectors/straggler.py): a participant whose figure stays beyond
    ``ratio`` x its peers' median (same job, same role) for ``sustain_seconds`` while at least
    ``min_peers`` peers report one. Rollouts: token throughput below ``throughput_ratio`` x
    the median; trainers: step time above ``step_time_ratio`` x the median, the rank's own
    ``train_step_seconds`` or, without one, the median of its last ``pace_steps`` step times."""

    min_peers: int = Field(default=3, ge=1)
    sustain_seconds: float = Field(default=120, gt=0)
    throughput_ratio: float = Field(default=0.5, gt=0, lt=1)
    step_time_ratio: float = Field(default=2.0, gt=1)
    pace_steps: int = Field(default=5, ge=1)
    # Groups of fewer than min_peers peers and at least this many: the small-group rule.
    small_group_min_peers: int = Field(default=1, ge=1)
    small_group_agreement: float = Field(default=1.5, gt=1)
    small_group_samples: int = Field(default=5, ge=1)


class DeadlockDetection(_Strict):
    """cross_role_deadlock (app/policy/detectors/deadlock.py): every trainer of a job in one of
    ``wait_phases`` with its step frozen, every rollout idle with nothing pending, this long."""

    wait_phases: tuple[str, ...] = ("ROLLOUT", "COLLECT", "WAIT", "WAIT_DATA", "WAIT_ROLLOUT")
    sustain_seconds: float = Field(default=90, gt=0)


class CounterfactualClass(_Strict):
    """What a whole-job restart costs for faults of ``kinds`` (the goodput ledger's
    counterfactual): ``detection_seconds`` until the fault is noticed (None: the human
    detection delay setting), ``restart_seconds`` until the restarted job runs again (None:
    the job's own measured start-up), and the published ``source`` of both figures."""

    kinds: tuple[FaultKind, ...] = Field(min_length=1)
    detection_seconds: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    restart_seconds: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    source: str = Field(min_length=1)


class CounterfactualCosts(_Strict):
    classes: dict[str, CounterfactualClass] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_class_per_kind(self) -> CounterfactualCosts:
        seen: dict[FaultKind, str] = {}
        for name, cls in self.classes.items():
            for kind in cls.kinds:
                if kind in seen:
                    raise ValueError(
                        f"classes.{name}: kind {kind.value} is already in class {seen[kind]}"
                    )
                seen[kind] = name
        return self

    def class_of(self, kind: str) -> tuple[str, CounterfactualClass] | None:
        for name, cls in self.classes.items():
            if kind in cls.kinds:
                return name, cls
        return None


class SampleFailureDetection(_Strict):
    """rollout_samples_failing (app/policy/detectors/rollout_failures.py): within the window,
    at least ``min_samples`` generations finished across the job's rollouts and at least
    ``failure_ratio`` of them failed or came back empty."""

    window_seconds: float = Field(default=120, gt=0)
    min_samples: int = Field(default=20, ge=1)
    failure_ratio: float = Field(default=0.3, gt=0, le=1)


class TrainInferDetection(_Strict):
    """Train/inference disagreement (app/policy/detectors/train_infer_mismatch.py): an
    engine's newest mean |trainer - engine| logprob (at most ``max_age_seconds`` old) above
    ``min_diff`` and above ``peer_ratio`` x its peers' median and ``history_ratio`` x its own
    earlier figures' median, where it has them."""

    min_diff: float = Field(default=0.02, gt=0)
    peer_ratio: float = Field(default=10.0, gt=1)
    history_ratio: float = Field(default=10.0, gt=1)
    max_age_seconds: float = Field(default=60, gt=0)


class Detection(_Strict):
    stale_sample_seconds: float = Field(default=15, gt=0)
    trainer: TrainerDetection = TrainerDetection()
    rollout: RolloutDetection = RolloutDetection()
    engine: EngineDetection = EngineDetection()
    heartbeat: HeartbeatDetection = HeartbeatDetection()
    startup: StartupDetection = StartupDetection()
    nodes: NodeDetection = NodeDetection()
    gpu: GpuDetection = GpuDetection()
    storage: StorageDetection = StorageDetection()
    env_drift: EnvDriftDetection = EnvDriftDetection()
    clock: ClockDetection = ClockDetection()
    straggler: StragglerDetection = StragglerDetection()
    train_infer: TrainInferDetection = TrainInferDetection()
    deadlock: DeadlockDetection = DeadlockDetection()
    sample_failures: SampleFailureDetection = SampleFailureDetection()

    @model_validator(mode="after")
    def _starting_is_not_gone(self) -> Detection:
        hb = self.heartbeat
        both = sorted(set(self.startup.phases) & set(hb.finished_phases + hb.exited_phases))
        if both:
            raise ValueError(
                f"startup.phases: phase(s) {both} cannot be start-up and finished or exited"
            )
        return self


class TierRule(_Strict):
    tier: Tier
    plan: tuple[ActionName, ...] = ()


class ExitCauseRule(TierRule):
    """A cause of the exit-cause catalogue (app/policy/exit_causes.py): the kind its incident
    gets, with the tier and plan of the cause rather than of the kind."""

    kind: FaultKind


class Escalation(_Strict):
    first_step_max: int = Field(default=1, ge=0)
    same_step_failures: int = Field(default=2, ge=2)
    local_recovery_failures: int = Field(default=2, ge=1)
    plan: tuple[ActionName, ...] = (ActionName.ENTER_SAFE_MODE, ActionName.RESTART_JOB)


class Approval(_Strict):
    automatic_actions: tuple[ActionName, ...] = (ActionName.ENTER_SAFE_MODE,)
    expire_seconds: float = Field(default=3600, gt=0)


class RecoveryLimits(_Strict):
    rollout_retry_times: int = Field(default=3, ge=0)
    rollout_timeout_sec: float = Field(default=120, gt=0)


class Forensics(_Strict):
    """Hang forensics: the Python stacks of a hung or stalled process, taken on its node
    (``py-spy dump`` by its launcher) as the first step of its ``restart_role``."""

    stacks_kinds: tuple[FaultKind, ...] = (
        FaultKind.TRAIN_HANG,
        FaultKind.TRAINER_IDLE,
        FaultKind.ROLLOUT_DOWN,
        FaultKind.ROLLOUT_ENGINE_DOWN,
        FaultKind.ROLLOUT_ENGINE_HUNG,
        FaultKind.ROLLOUT_ENGINE_WEDGED,
        FaultKind.HEARTBEAT_LOST,
    )
    stacks_timeout_seconds: float = Field(default=10, gt=0, le=60)
    stacks_max_bytes: int = Field(default=64 * 1024, ge=1024, le=1024 * 1024)


class ActionBudget(_Strict):
    """At most ``per_rank`` automatic actions of one kind on one participant (job, role, rank)
    and ``per_role`` on one role of a job within ``window_seconds``; one more escalates the
    incident to heavy. ``backoff_seconds`` (0: none) spaces automatic actions on one
    participant: the n-th within the window waits ``backoff_seconds * 2**(n-1)`` after the
    previous one, so a flapping process is not restarted in a tight loop."""

    per_rank: int = Field(default=3, ge=1)
    per_role: int = Field(default=10, ge=1)
    window_seconds: float = Field(default=1800, gt=0)
    backoff_seconds: float = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _role_holds_a_rank(self) -> ActionBudget:
        if self.per_role < self.per_rank:
            raise ValueError(
                f"per_role ({self.per_role}) must not be below per_rank ({self.per_rank})"
            )
        return self


class BreakerLimits(_Strict):
    """More than ``max_actions`` automatic actions, or actions on more than ``max_nodes``
    distinct nodes, within ``window_seconds`` trip the breaker of the scope."""

    max_actions: int = Field(ge=1)
    max_nodes: int = Field(ge=1)
    window_seconds: float = Field(gt=0)


class Guardrails(_Strict):
    budgets: dict[ActionName, ActionBudget] = Field(
        default_factory=lambda: {ActionName.RESTART_ROLE: ActionBudget()}
    )
    job_breaker: BreakerLimits = BreakerLimits(max_actions=20, max_nodes=8, window_seconds=600)
    cluster_breaker: BreakerLimits = BreakerLimits(max_actions=60, max_nodes=16, window_seconds=600)

    @model_validator(mode="after")
    def _automatic_kinds_only(self) -> Guardrails:
        # A release runs only when an approver asked for it: a budget on it would refuse a
        # person, not automation.
        if ActionName.RELEASE_SAFE_MODE in self.budgets:
            raise ValueError("budgets.release_safe_mode: a release is never automatic")
        return self


class Incidents(_Strict):
    quiet_period_seconds: float = Field(default=30, ge=0)


SubjectPart = Literal["node", "job", "role", "rank", "gpu"]


class AlertmanagerMapping(_Strict):
    kind_label: str = "rlguard_kind"
    alertname_kinds: dict[str, FaultKind] = Field(default_factory=dict)
    default_kind: FaultKind = FaultKind.EXTERNAL_ALERT
    subject_labels: dict[SubjectPart, str] = Field(default_factory=dict)


class Policy(_Strict):
    version: Literal[1]
    tick_seconds: float = Field(default=1.0, gt=0)
    incidents: Incidents = Incidents()
    golden_metrics: dict[str, GoldenMetricRule]
    detection: Detection = Detection()
    tiers: dict[FaultKind, TierRule]
    # Tier and plan of a gpu_xid by the NVIDIA resolution bucket of its XID (the tiers rule of
    # gpu_xid is for an XID whose code is not known, e.g. from Alertmanager).
    xid_buckets: dict[XidBucket, TierRule]
    escalation: Escalation = Escalation()
    approval: Approval = Approval()
    recovery: RecoveryLimits = RecoveryLimits()
    alertmanager: AlertmanagerMapping = AlertmanagerMapping()
    guardrails: Guardrails = Guardrails()
    forensics: Forensics = Forensics()
    # Per exit cause (a failed process's own output, matched by its launcher): the rules of the
    # exit-cause catalogue, overridden cause by cause by this file's ``exit_causes``.
    exit_causes: dict[str, ExitCauseRule] = Field(default_factory=dict)
    # The goodput ledger's whole-job-restart counterfactual per class of fault.
    counterfactual: CounterfactualCosts = CounterfactualCosts()

    @model_validator(mode="after")
    def _complete(self) -> Policy:
        unknown = sorted(set(self.golden_metrics) - set(GOLDEN_METRICS))
        if unknown:
            raise ValueError(
                f"golden_metrics.{unknown[0]}: not a golden metric "
                f"(expected one of {', '.join(GOLDEN_METRICS)})"
            )
        missing = sorted(k.value for k in FaultKind if k not in self.tiers)
        if missing:
            raise ValueError(f"tiers: no rule for fault kind(s) {', '.join(missing)}")
        no_rule = sorted(b.value for b in XidBucket if b not in self.xid_buckets)
        if no_rule:
            raise ValueError(f"xid_buckets: no rule for bucket(s) {', '.join(no_rule)}")
        return self

    def tier_rule(self, kind: FaultKind) -> TierRule:
        return self.tiers[kind]

    def time_scaled(self, factor: float) -> Policy:
        """This policy with every duration (each ``*_seconds`` key, the tick included)
        divided by ``factor``: the policy for a trace time-compressed by the same factor
        (``app.policy.replay.compress``). Counts, ratios and thresholds stay as they are."""
        if not factor > 0:
            raise ValueError(f"time scale factor must be positive, got {factor}")
        return Policy.model_validate(_scale_durations(self.model_dump(), factor))

    def rule_for(self, signal: FaultSignal) -> TierRule:
        """The signal's rule: a gpu_xid whose code is known by its XID's bucket, the rest by
        kind."""
        xid = signal.extra.get("xid")
        if signal.kind is FaultKind.GPU_XID and isinstance(xid, int):
            return self.xid_buckets[bucket_of(xid)]
        cause = signal.extra.get("exit_cause")
        if isinstance(cause, str):
            rule = self.exit_causes.get(cause)
            if rule is not None and rule.kind is signal.kind:
                return rule
        return self.tiers[signal.kind]


def _scale_durations(data: Any, factor: float) -> Any:
    if isinstance(data, dict):
        return {
            k: (
                _divide(v, factor)
                if isinstance(k, str) and k.endswith("_seconds")
                else _scale_durations(v, factor)
            )
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [_scale_durations(v, factor) for v in data]
    return data


def _divide(value: Any, factor: float) -> Any:
    """A duration, or a table of them (``startup_grace_seconds`` per role), over ``factor``."""
    if isinstance(value, dict):
        return {k: _divide(v, factor) for k, v in value.items()}
    return value / factor if isinstance(value, (int, float)) else value


def _format_error(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        got = err.get("input")
        shown = (
            ""
            if err["type"] in ("missing", "extra_forbidden") or isinstance(got, dict)
            else f" (got {got!r})"
        )
        lines.append(f"{loc}: {msg}{shown}")
    return f"invalid policy file {source}: " + "; ".join(lines)


def parse_policy(data: Any, *, source: str = "<policy>") -> Policy:
    """Validate already-parsed policy data; raises PolicyFileError naming the bad key."""
    if not isinstance(data, dict):
        raise PolicyFileError(f"invalid policy file {source}: the top level must be a mapping")
    try:
        causes = catalogue_rules()
    except ExitCauseCatalogueError as exc:
        raise PolicyFileError(str(exc)) from None
    overrides = data.get("exit_causes")
    if isinstance(overrides, dict):
        causes.update(overrides)
    elif overrides is not None:
        raise PolicyFileError(f"invalid policy file {source}: exit_causes must be a mapping")
    try:
        return Policy.model_validate({**data, "exit_causes": causes})
    except ValidationError as exc:
        raise PolicyFileError(_format_error(source, exc)) from None


def load_policy(path: str | Path | None = None) -> Policy:
    """Load the policy from ``path`` (default: the shipped ``policy.yaml``). A fault kind or
    XID bucket that an operator's file does not name takes the shipped rule
    (:func:`with_shipped_rules`); the shipped file itself must name every one."""
    p = Path(path) if path is not None else DEFAULT_POLICY_PATH
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyFileError(f"cannot read policy file {p}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyFileError(f"policy file {p} is not valid YAML: {exc}") from None
    if isinstance(data, dict) and p.resolve() != DEFAULT_POLICY_PATH.resolve():
        data, _ = with_shipped_rules(data, str(p))
    return parse_policy(data, source=str(p))


def default_policy() -> Policy:
    return load_policy(DEFAULT_POLICY_PATH)
