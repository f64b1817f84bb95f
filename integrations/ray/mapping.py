"""Ray actors as RLGuard participants ``(job, role, rank)``.

The job is named for its Ray job: ``metadata["rlguard_job"]`` when the job was submitted with
it, else its Jobs API submission id, else ``ray-<job id>``; ``job_name`` overrides them all
(one training job per cluster, the usual verl and OpenRLHF set-up). Roles and ranks come from
the preset (:mod:`integrations.ray.presets`). An actor no rule matches is left out and named
once in :attr:`MappedActors.unmatched`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from integrations.ray.presets import Preset
from integrations.ray.state import ActorRecord, JobRecord
from recovery.report import safe_job_name


@dataclass(frozen=True, slots=True)
class MappedActor:
    job: str
    role: str
    rank: int
    actor: ActorRecord


@dataclass(slots=True)
class MappedActors:
    actors: list[MappedActor] = field(default_factory=list)
    # class names no rule matched (each once), for the agent's log
    unmatched: set[str] = field(default_factory=set)

    def find(self, job: str, role: str, rank: int) -> MappedActor | None:
        for mapped in self.actors:
            if (mapped.job, mapped.role, mapped.rank) == (job, role, rank):
                return mapped
        return None


def job_name_of(job: JobRecord) -> str:
    """The RLGuard name of a Ray job (module docstring)."""
    name = job.metadata.get("rlguard_job") or job.submission_id or f"ray-{job.job_id}"
    return safe_job_name(name)


def job_names(jobs: Iterable[JobRecord]) -> dict[str, str]:
    """Ray job id -> RLGuard job name, for the jobs that have a driver."""
    return {job.job_id: job_name_of(job) for job in jobs if job.job_id}


_ENDED = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


def superseded_jobs(jobs: Iterable[JobRecord], job_name: str | None = None) -> set[str]:
    """Ray job ids that ended while another Ray job of the same RLGuard name runs (a job that
    was resubmitted): their dead actors would otherwise keep the participants' ranks."""
    by_name: dict[str, list[JobRecord]] = defaultdict(list)
    for job in jobs:
        if not job.job_id:
            continue
        # Only Jobs API submissions are resubmitted: a plain driver (another program connected
        # to the cluster) never supersedes one, even when every actor goes to one job_name.
        named = job.metadata.get("rlguard_job")
        by_name[named or (job_name if job_name and job.submission_id else job_name_of(job))].append(
            job
        )
    out: set[str] = set()
    for members in by_name.values():
        if any(j.status not in _ENDED for j in members):
            out.update(str(j.job_id) for j in members if j.status in _ENDED)
    return out


def _rank_key(
    actor: ActorRecord, found_rank: int | None, group_local: tuple[int, int] | None
) -> tuple[object, ...]:
    # Ranks given by the name first, then (group, local) pairs, then actor ids: a stable order.
    return (found_rank is None, found_rank or 0, group_local or (0, 0), actor.actor_id)


# The namespace of the JobSupervisor actor Ray starts for each Jobs API submission
# (ray.dashboard.modules.job.common.SUPERVISOR_ACTOR_RAY_NAMESPACE, Ray 2.60.0).
RAY_JOB_SUPERVISOR_NAMESPACE = "SUPERVISOR_ACTOR_RAY_NAMESPACE"


def map_actors(
    actors: Iterable[ActorRecord],
    preset: Preset,
    jobs: Iterable[JobRecord] = (),
    *,
    job_name: str | None = None,
) -> MappedActors:
    """Give each actor that a rule matches its ``(job, role, rank)``.

    Within one job and role an actor's rank is the number in its name's ``rank`` group when
    the rule has one; otherwise actors are numbered 0.. in the order of their name's
    ``(group, local)`` numbers, else of their actor ids. A restarted actor keeps its id, hence
    its rank.
    """
    jobs = list(jobs)
    names = job_names(jobs)
    fixed = safe_job_name(job_name) if job_name else None
    superseded = superseded_jobs(jobs, fixed)
    ended = frozenset(str(j.job_id) for j in jobs if j.job_id and j.status in _ENDED)
    result = MappedActors()
    grouped: dict[tuple[str, str], list[tuple[tuple[object, ...], int | None, ActorRecord]]] = (
        defaultdict(list)
    )
    for actor in actors:
        if actor.job_id in superseded:
            continue  # a resubmission of the same job runs: its actors are the participants now
        if actor.namespace == RAY_JOB_SUPERVISOR_NAMESPACE:
            continue  # Ray's own actor behind every Jobs API submission, never a job's worker
        found = preset.role_of(actor.class_name, actor.name)
        if found is None:
            result.unmatched.add(actor.class_name)
            continue
        role, groups = found
        named_rank, group, local = groups.get("rank"), groups.get("group"), groups.get("local")
        rank = int(named_rank) if named_rank is not None else None
        pair = (int(group), int(local)) if group is not None and local is not None else None
        job = fixed or names.get(actor.job_id) or safe_job_name(f"ray-{actor.job_id}")
        grouped[(job, role)].append((_rank_key(actor, rank, pair), rank, actor))
    for (job, role), members in grouped.items():
        members.sort(key=lambda item: item[0])
        ranked = [
            MappedActor(job, role, rank if rank is not None else index, actor)
            for index, (_key, rank, actor) in enumerate(members)
        ]
        result.actors.extend(_replaced_left_out(ranked, ended))
    return result


# A participant's actor by what it can do for the job: one of a Ray job still running before one
# of a job that ended (an earlier run of the same job name on a long-lived cluster, its actors
# dead with OWNER_DIED); then serving, then dead (its death is the incident), then not yet
# created (starting, or a restarter's warm standby waiting in its creation,
# :mod:`integrations.ray.restarter`).
_SERVING = frozenset({"ALIVE", "RESTARTING"})


def _tier(actor: ActorRecord, ended: frozenset[str]) -> tuple[bool, int]:
    state = 0 if actor.state in _SERVING else 1 if actor.state == "DEAD" else 2
    return (actor.job_id in ended, state)


def _replaced_left_out(members: list[MappedActor], ended: frozenset[str]) -> list[MappedActor]:
    """The actors of each rank of the best tier (``_tier``): a DEAD actor whose rank a serving
    actor holds was replaced (created again under a name of its own,
    :mod:`integrations.ray.restarter`); an actor whose creation has not finished replaces
    nobody: a dead one stays the participant, and its death the incident, until the new one is
    created; an ended job's actors give way to a running job's."""
    best: dict[int, tuple[bool, int]] = {}
    for m in members:
        tier = _tier(m.actor, ended)
        best[m.rank] = min(best.get(m.rank, tier), tier)
    return [m for m in members if _tier(m.actor, ended) == best[m.rank]]
