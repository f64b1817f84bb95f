"""Tiers and recovery plans: the policy file's tier rules plus RobustRL's escalation.

Escalation gives up on local recovery and plans a whole-job restart (heavy, so it waits for an
approver) when a fault hits a job in its first step, when the same step fails again, or when a
local recovery of the same incident has failed ``local_recovery_failures`` times.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.policy.plans import ALWAYS_APPROVED_ACTIONS, ActionName, PlannedAction
from app.policy.policy_file import Policy
from app.policy.signals import FaultSignal, Tier
from app.policy.world import World


@dataclass(frozen=True, slots=True)
class Classification:
    tier: Tier
    actions: tuple[ActionName, ...]
    escalated: bool
    reasons: tuple[str, ...]


class Classifier:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def classify(
        self, signal: FaultSignal, *, job_step: int | None, recovery_failures: int = 0
    ) -> Classification:
        tier, plan = self._tier_and_plan(signal)
        esc = self.policy.escalation
        reasons: list[str] = []
        # Only faults that need recovery escalate: an alert-only signal (throttling, drift)
        # in the first step must not restart a job.
        if plan:
            if job_step is not None and job_step <= esc.first_step_max:
                reasons.append(f"anomaly in the job's first step (step {job_step})")
            same = signal.extra.get("same_step_failures")
            if isinstance(same, int) and same >= esc.same_step_failures:
                reasons.append(f"step {signal.step} failed {same} times")
            if recovery_failures >= esc.local_recovery_failures:
                reasons.append(f"local recovery failed {recovery_failures} times")
        if reasons:
            return Classification(Tier.HEAVY, esc.plan, True, tuple(reasons))
        return Classification(tier, plan, False, ())

    def _tier_and_plan(self, signal: FaultSignal) -> tuple[Tier, tuple[ActionName, ...]]:
        """The signal's tier rule; signals folded into it (same root cause) add their plans
        and can raise the tier, so one incident recovers from everything its cause did.
        Signals about another subject (the GPUs of a ``node_gpus_failed``) are its evidence
        only: the node's plan speaks for its GPUs."""
        rule = self.policy.rule_for(signal)
        tier, plan = rule.tier, rule.plan
        for other in signal.related:
            if other.subject != signal.subject:
                continue
            extra = self.policy.rule_for(other)
            if extra.tier.rank > tier.rank:
                tier = extra.tier
            plan += tuple(a for a in extra.plan if a not in plan)
        return tier, plan


def _jobs(signal: FaultSignal, world: World) -> list[str]:
    if signal.subject.job is not None:
        return [signal.subject.job]
    if signal.subject.node is not None:
        return world.jobs_on_node(signal.subject.node)
    return []


def _stacks_wanted(policy: Policy, signal: FaultSignal) -> dict[str, float | int] | None:
    """What a ``restart_role`` of this signal asks its launcher to capture first (hang
    forensics), or None: only where a hung or stalled process may still be there to read."""
    f = policy.forensics
    kinds = {signal.kind, *(other.kind for other in signal.related)}
    if not kinds & set(f.stacks_kinds):
        return None
    return {"timeout_seconds": f.stacks_timeout_seconds, "max_bytes": f.stacks_max_bytes}


def choose_actions(
    *, policy: Policy, classification: Classification, signal: FaultSignal, world: World
) -> list[PlannedAction]:
    """Expand the classification's action names into concrete actions with their targets."""
    heavy = classification.tier is Tier.HEAVY
    automatic = set(policy.approval.automatic_actions)
    subj = signal.subject
    who = {"role": subj.role, "rank": subj.rank}  # the participant the signal is about
    kind = signal.kind.value
    retry = {
        "max_retries": policy.recovery.rollout_retry_times,
        "timeout_sec": policy.recovery.rollout_timeout_sec,
    }
    out: list[PlannedAction] = []

    def add(action: ActionName, job: str | None, node: str | None, **params: object) -> None:
        needs = (heavy or action in ALWAYS_APPROVED_ACTIONS) and action not in automatic
        clean = {k: v for k, v in params.items() if v is not None}
        planned = PlannedAction(action, job, node, needs, clean)
        if all(p.identity() != planned.identity() for p in out):
            out.append(planned)

    # A heavy plan of a hung or stalled participant (a first-step hang escalates) holds the job
    # for a person instead of restarting it: its stacks are taken when SAFE_MODE is entered, on
    # its node, while the process is still where it hung (a collective watchdog or the
    # approved restart_job would end it).
    held_stacks = (
        _stacks_wanted(policy, signal)
        if subj.role is not None and ActionName.RESTART_ROLE not in classification.actions
        else None
    )
    for action in classification.actions:
        for job in _jobs(signal, world):
            members = [p for p in world.participants if p.job == job]
            if action is ActionName.ENTER_SAFE_MODE:
                nodes = sorted({p.node for p in members}) or ([subj.node] if subj.node else [])
                for node in nodes:
                    if held_stacks is not None and node == subj.node and job == subj.job:
                        add(action, job, node, reason=kind, capture_stacks=held_stacks, **who)
                    else:
                        add(action, job, node, reason=kind)
            elif action is ActionName.RETRY_ROLLOUT_BATCH:
                if subj.node:
                    add(action, job, subj.node, **who, **retry)
            elif action is ActionName.SKIP_FAILED_STEP:
                if subj.node:
                    add(action, job, subj.node, step=signal.step, **who)
            elif action is ActionName.REBUILD_SHARD:
                if subj.node:
                    add(action, job, subj.node, rank=subj.rank)
            elif action is ActionName.RESCHEDULE_BATCHES:
                add(action, job, None, away_from=subj.node)
            elif action is ActionName.RESTART_ROLE:
                stacks = _stacks_wanted(policy, signal)
                if subj.role is not None:
                    add(action, job, subj.node, capture_stacks=stacks, **who)
                else:
                    on_node = [p for p in members if subj.node is None or p.node == subj.node]
                    for p in sorted(on_node, key=lambda p: (p.role, p.rank)):
                        add(action, job, p.node, role=p.role, rank=p.rank, capture_stacks=stacks)
            elif action is ActionName.DRAIN_NODE:
                xid = signal.extra.get("xid")
                if subj.node and isinstance(xid, int) and xid in policy.detection.gpu.drain_xids:
                    add(action, job, subj.node, xid=xid, gpu=subj.gpu)
            else:  # restore_checkpoint, restart_job: the whole job
                add(action, job, None)
    return out
