"""What the ledger answers (REST, dashboard, CLI and metrics read the same models)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


class ClassAssumptionPublic(BaseModel):
    """A class of faults whose own published figures the counterfactual used."""

    name: str
    kinds: list[str]
    detection_seconds: float | None  # None: the human detection delay
    restart_seconds: float | None  # None: the job's measured start-up
    source: str


class AssumptionsPublic(BaseModel):
    """What the whole-job-restart counterfactual and the money figures rest on."""

    human_detection_seconds: float
    startup_seconds: float
    startup_source: str  # measured (first report → first new step) | unknown
    typical_step_seconds: float | None
    price_per_gpu_hour: float
    gpu_count: int
    gpu_count_source: str  # reported (the nodes' GPUs) | default (a setting per node)
    checkpoint_source: str  # reported | assumed every N steps
    # the classes of the window's incidents with figures of their own (policy counterfactual)
    classes: list[ClassAssumptionPublic] = []
    summary: str = ""  # one line of all the above, shown beside every saved figure


class CounterfactualPublic(BaseModel):
    """The same faults under a whole-job restart from the newest checkpoint."""

    lost_seconds: float
    ettr: float
    gpu_hours_lost: float
    gpu_hours_saved: float
    money_saved: float
    assumptions: AssumptionsPublic


class IncidentGoodput(BaseModel):
    id: int
    kind: str
    tier: str
    fault_at: datetime
    detected_at: datetime
    recovered_at: datetime | None
    resumed_at: datetime | None  # the first new step after the recovery
    lost_seconds: float
    counted_seconds: float  # in the window, less what an earlier incident already counted
    segments: dict[str, float]  # detect, approve, recover, redo (they add up to lost_seconds)
    steps_redone: int
    ongoing: bool
    whole_job_restart_seconds: float
    whole_job_restart_steps_redone: int
    # A fault injected on purpose (rlguard drill): listed with its cost, never counted in the
    # job's lost time, ETTR or counterfactual (counted_seconds is 0).
    drill: bool = False


class EttrPoint(BaseModel):
    start: datetime
    end: datetime
    ettr: float


class JobGoodput(BaseModel):
    job: str
    since: datetime
    until: datetime
    wall_seconds: float
    productive_seconds: float
    lost_seconds: float
    ettr: float
    gpu_count: int
    gpu_hours_lost: float
    cost_lost: float
    # the incidents' segments added up (time two incidents share counts in each)
    segments: dict[str, float]
    incidents: list[IncidentGoodput]
    series: list[EttrPoint]
    counterfactual: CounterfactualPublic
