"""What the Ray state API says about a cluster: actors, nodes and jobs, each call with a timeout.

The state API is served by the Ray dashboard (``ray start --head`` starts it; ``ray[default]``
installs it), at ``http://HEAD:8265`` or found with ``address="auto"`` on a node of the
cluster. :class:`RayStateReader` turns its answers into plain records (:class:`ActorRecord`,
:class:`NodeRecord`, :class:`JobRecord`) so that the mapping and the collector can be fed a
recorded answer too (the benchmark does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Ray's actor states (gcs.proto ActorTableData.ActorState) that mean "not running now".
LOST_STATES = frozenset({"DEAD", "RESTARTING"})


class RayUnavailable(RuntimeError):
    """The Ray cluster's state API did not answer (unreachable, timed out, not installed)."""


@dataclass(frozen=True, slots=True)
class ActorRecord:
    """One actor as the state API lists it (the fields RLGuard uses)."""

    actor_id: str
    class_name: str
    state: str
    job_id: str
    name: str
    node_id: str | None
    pid: int | None
    num_restarts: int
    death_reason: str | None
    death_message: str | None
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class NodeRecord:
    node_id: str
    node_ip: str
    state: str
    is_head: bool


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A Ray job: its driver's job id, and for a job submitted through the Jobs API its
    submission id, entrypoint and metadata."""

    job_id: str | None
    submission_id: str | None
    status: str
    entrypoint: str
    metadata: Mapping[str, str]


def _death(cause: Any) -> tuple[str | None, str | None]:
    """(reason, message) from Ray's ``death_cause`` (one ``*_context`` of ActorDeathCause)."""
    if not isinstance(cause, Mapping):
        return None, None
    for context_name, context in cause.items():
        if isinstance(context, Mapping):
            reason = context.get("reason")
            message = context.get("error_message")
            kind = context_name.removesuffix("_context").upper()
            return (
                str(reason) if reason else kind,
                str(message) if message is not None else None,
            )
    return None, None


def actor_from_dict(doc: Mapping[str, Any]) -> ActorRecord:
    """An :class:`ActorRecord` from one actor of the state API (as ``ActorState`` or a dict)."""
    reason, message = _death(doc.get("death_cause"))
    pid = doc.get("pid")
    return ActorRecord(
        actor_id=str(doc["actor_id"]),
        class_name=str(doc.get("class_name") or ""),
        state=str(doc.get("state") or "UNKNOWN"),
        job_id=str(doc.get("job_id") or ""),
        name=str(doc.get("name") or ""),
        node_id=doc.get("node_id") or None,
        pid=int(pid) if isinstance(pid, int) and pid > 0 else None,
        num_restarts=int(doc.get("num_restarts") or 0),
        death_reason=reason,
        death_message=message,
        namespace=doc.get("ray_namespace") or None,
    )


def node_from_dict(doc: Mapping[str, Any]) -> NodeRecord:
    return NodeRecord(
        node_id=str(doc["node_id"]),
        node_ip=str(doc.get("node_ip") or ""),
        state=str(doc.get("state") or "UNKNOWN"),
        is_head=bool(doc.get("is_head_node")),
    )


def job_from_dict(doc: Mapping[str, Any]) -> JobRecord:
    status = doc.get("status")
    return JobRecord(
        job_id=doc.get("job_id") or None,
        submission_id=doc.get("submission_id") or None,
        status=str(getattr(status, "value", status) or "UNKNOWN"),
        entrypoint=str(doc.get("entrypoint") or ""),
        metadata={str(k): str(v) for k, v in (doc.get("metadata") or {}).items()},
    )


def _as_dict(item: Any) -> Mapping[str, Any]:
    if isinstance(item, Mapping):
        return item
    found: Mapping[str, Any] = vars(item)  # the state API's records are dataclasses
    return found


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    actors: tuple[ActorRecord, ...]
    nodes: tuple[NodeRecord, ...]
    jobs: tuple[JobRecord, ...]


class RayStateReader:
    """Reads the state API of the cluster at ``address`` (``auto`` or ``http://HEAD:8265``).

    Every call takes ``timeout`` seconds at most; any failure is :class:`RayUnavailable` with
    one line naming the address.
    """

    def __init__(self, address: str, *, timeout: float = 2.0, limit: int = 10_000) -> None:
        self.address = address
        self.timeout = timeout
        self.limit = limit

    def snapshot(self) -> ClusterSnapshot:
        """Actors, nodes and jobs now (three calls, each bounded by ``timeout``)."""
        try:
            from ray.util.state import list_actors, list_jobs, list_nodes
        except ImportError as exc:
            raise RayUnavailable(
                f"ray is not installed: pip install 'rlguard[ray]' ({exc})"
            ) from None
        address = None if self.address == "auto" else self.address
        timeout = max(1, round(self.timeout))  # the state API takes whole seconds
        try:
            actors = list_actors(
                address=address,
                limit=self.limit,
                timeout=timeout,
                detail=True,
                raise_on_missing_output=False,
            )
            nodes = list_nodes(
                address=address,
                limit=self.limit,
                timeout=timeout,
                detail=True,
                raise_on_missing_output=False,
            )
            jobs = list_jobs(address=address, limit=self.limit, timeout=timeout, detail=True)
        except Exception as exc:  # the state API raises many kinds (ServerUnavailable, HTTP, ...)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RayUnavailable(f"Ray at {self.address} did not answer: {first[:300]}") from exc
        return ClusterSnapshot(
            actors=tuple(actor_from_dict(_as_dict(a)) for a in actors),
            nodes=tuple(node_from_dict(_as_dict(n)) for n in nodes),
            jobs=tuple(job_from_dict(_as_dict(j)) for j in jobs),
        )
