"""Recovery actions the policy engine can plan, and where each one runs.

Node-local actions act on files of the node (the job's WAL, control file, shard snapshots), so
they go to the queue of the node's own worker; cluster actions (rescheduling, launcher hooks,
checkpoint restore) go to the shared ``cluster`` queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class ActionName(StrEnum):
    RETRY_ROLLOUT_BATCH = "retry_rollout_batch"
    SKIP_FAILED_STEP = "skip_failed_step"
    REBUILD_SHARD = "rebuild_shard"
    RESCHEDULE_BATCHES = "reschedule_batches"
    RESTART_ROLE = "restart_role"
    ENTER_SAFE_MODE = "enter_safe_mode"
    RESTORE_CHECKPOINT = "restore_checkpoint"
    RESTART_JOB = "restart_job"
    # Take a node out of the scheduler's service (Slurm DRAIN) after a GPU fault whose XID says
    # the node needs a person; through the launcher hook, whose backend knows the scheduler.
    DRAIN_NODE = "drain_node"
    # Not planned by the engine: an approver releases a job from SAFE_MODE
    # (app.incidents.safe_mode_release).
    RELEASE_SAFE_MODE = "release_safe_mode"


NODE_LOCAL_ACTIONS = frozenset(
    {
        ActionName.RETRY_ROLLOUT_BATCH,
        ActionName.SKIP_FAILED_STEP,
        ActionName.REBUILD_SHARD,
        ActionName.ENTER_SAFE_MODE,
        ActionName.RELEASE_SAFE_MODE,
    }
)

# Actions that act on a job as a whole: one in flight serves every incident of the job (one dead
# driver loses the trainer and the rollout, two incidents; one resubmission heals both, and a
# second one approved later would stop the job the first had just brought back).
WHOLE_JOB_ACTIONS = frozenset({ActionName.RESTART_JOB, ActionName.RESTORE_CHECKPOINT})

# Actions that wait for an approver whatever the incident's tier: a drain takes a machine
# away from every job of the cluster, not only from the one that saw the fault.
ALWAYS_APPROVED_ACTIONS = frozenset({ActionName.DRAIN_NODE})

CLUSTER_QUEUE = "cluster"


def queue_for(action: ActionName, node: str | None) -> str:
    """The Celery queue an action is routed to."""
    if action in NODE_LOCAL_ACTIONS:
        if not node:
            raise ValueError(f"node-local action {action.value} needs a node")
        return f"node.{node}"
    return CLUSTER_QUEUE


@dataclass(frozen=True, slots=True)
class PlannedAction:
    """One step of a recovery plan, before it is written to the outbox."""

    action: ActionName
    job: str | None
    node: str | None
    needs_approval: bool
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def queue(self) -> str:
        return queue_for(self.action, self.node)

    def identity(self) -> str:
        """What makes two planned actions the same (for the idempotency key)."""
        rank = self.params.get("rank")
        role = self.params.get("role")
        step = self.params.get("step")
        return ":".join(
            str(p)
            for p in (self.action.value, self.job, self.node, role, rank, step)
            if p is not None
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlannedAction:
        """The inverse of ``to_dict`` (``queue`` is derived, not read)."""
        return cls(
            action=ActionName(data["action"]),
            job=data.get("job"),
            node=data.get("node"),
            needs_approval=bool(data["needs_approval"]),
            params=dict(data.get("params") or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "job": self.job,
            "node": self.node,
            "queue": self.queue,
            "needs_approval": self.needs_approval,
            "params": dict(self.params),
        }
