"""Several GPUs of one node failing together are one node-level incident, not one per GPU.

After the per-GPU folding (``app.policy.root_cause``) this step makes a node's GPUs with the
same failure one ``node_gpus_failed`` signal about the node, whose ``related`` are the per-GPU
signals; its incident also inhibits the node's per-participant alerts (``NODE_KINDS`` in
``app.silences.muting``).

The rule (``detection.gpu.correlated``): at least ``min_gpus`` distinct GPUs of the node (None:
every GPU it reports; never fewer than 2) with the same failure, begun within ``window_seconds``
of each other. A fault is a lost GPU or an XID of one of ``xid_buckets``; the same failure is
off the bus (lost, or XID 79) or XIDs of one bucket. A burst still below ``min_gpus`` waits
``settle_seconds`` for the rest of the node before its GPUs open incidents of their own; a GPU
whose own incident opened before the burst moves into the node incident, and once that exists
the node's GPU faults stay in it rather than reopening one by one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from app.policy.policy_file import CorrelatedGpuFaults, Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject
from app.policy.xid_catalog import XidBucket, bucket_of

NODE_KIND = FaultKind.NODE_GPUS_FAILED


def fold_node_gpu_failures(
    signals: list[FaultSignal],
    tracked: dict[str, float | None],
    policy: Policy,
    gpus_of_node: Callable[[str], int],
) -> list[FaultSignal]:
    """Replace each node's correlated GPU faults by one ``node_gpus_failed`` signal, in the
    place of the first of them. ``tracked``: incident keys the engine follows with the since of
    their occurrence; ``gpus_of_node``: how many GPUs a node reports (0: unknown)."""
    cfg = policy.detection.gpu.correlated
    per_node: dict[str, list[FaultSignal]] = {}
    for s in signals:
        if s.subject.node is not None and s.subject.gpu is not None and _gpu_failed(s, cfg):
            per_node.setdefault(s.subject.node, []).append(s)
    folded: dict[str, FaultSignal] = {}
    held: set[int] = set()
    for node, candidates in per_node.items():
        key = f"{NODE_KIND.value}:{Subject(node=node).key()}"
        if key in tracked:
            group, since = candidates, tracked[key]
        else:
            group = _burst(candidates, cfg.window_seconds)
            reported = gpus_of_node(node)
            need = max(2, cfg.min_gpus if cfg.min_gpus is not None else reported)
            if cfg.min_gpus is None and reported == 0:
                continue  # "every GPU of the node" with no GPU count known: not judged
            gpus = len({s.subject.gpu for s in group})
            if gpus < need:
                if gpus >= 2:
                    held.update(_settling(group, tracked, cfg.settle_seconds))
                continue
            since = min(_start(s) for s in group)
        folded[node] = _node_signal(node, group, since, policy, gpus_of_node(node))
    if not folded and not held:
        return signals
    members = {id(m) for sig in folded.values() for m in sig.related}
    out: list[FaultSignal] = []
    placed: set[str] = set()
    for s in signals:
        if id(s) in held:
            continue
        if id(s) not in members:
            out.append(s)
            continue
        at = s.subject.node
        assert at is not None  # members are per-GPU signals of a node
        if at not in placed:
            placed.add(at)
            out.append(folded[at])
    return out


def _settling(
    group: list[FaultSignal], tracked: dict[str, float | None], settle: float
) -> list[int]:
    """A burst of two or more GPUs, still below min_gpus, waits ``settle`` seconds from its
    first fault for the rest of the node before its GPUs open incidents of their own (a
    baseboard's GPUs report over one or two agent rounds). A lone GPU never waits, nor a GPU
    whose incident is already open."""
    now = max(s.detected_at for s in group)
    if now - min(_start(s) for s in group) >= settle:
        return []
    return [id(s) for s in group if s.incident_key not in tracked]


def _gpu_failed(sig: FaultSignal, cfg: CorrelatedGpuFaults) -> bool:
    """The GPU is lost, or has an XID that needs the GPU or node serviced (or an XID whose
    code is not known: the agent counted it as critical)."""
    for s in (sig, *sig.related):
        if s.kind is FaultKind.GPU_LOST:
            return True
        if s.kind is FaultKind.GPU_XID:
            xid = s.extra.get("xid")
            if not isinstance(xid, int) or bucket_of(xid) in cfg.xid_buckets:
                return True
    return False


def _start(sig: FaultSignal) -> float:
    return sig.since if sig.since is not None else sig.detected_at


def _failure(sig: FaultSignal) -> str:
    """What failed, so that only the same failure on several GPUs is one cause: ``lost`` (off
    the bus: gpu_lost, or an XID whose bucket is a node reboot, as 79), else the XID's bucket
    (74 on every GPU: the NVLink fabric), ``xid`` for an XID whose code is not known."""
    if _lost(sig):
        return "lost"
    xid = sig.extra.get("xid")
    if not isinstance(xid, int):
        return "xid"
    bucket = bucket_of(xid)
    return "lost" if bucket is XidBucket.RESTART_BM else bucket.value


def _burst(signals: list[FaultSignal], window: float) -> list[FaultSignal]:
    """The largest set of signals of one failure (by distinct GPUs) whose starts lie within
    ``window``."""
    by_failure: dict[str, list[FaultSignal]] = {}
    for s in signals:
        by_failure.setdefault(_failure(s), []).append(s)
    best: list[FaultSignal] = []
    best_gpus = 0
    for same in by_failure.values():
        ordered = sorted(same, key=_start)
        lo = 0
        for hi, s in enumerate(ordered):
            while _start(s) - _start(ordered[lo]) > window:
                lo += 1
            group = ordered[lo : hi + 1]
            gpus = len({g.subject.gpu for g in group})
            if gpus > best_gpus:
                best, best_gpus = group, gpus
    return best


def _xids(sig: FaultSignal) -> list[int]:
    codes: set[int] = set()
    for s in (sig, *sig.related):
        listed = s.extra.get("xids")
        if isinstance(listed, list):
            codes.update(c for c in listed if isinstance(c, int))
        xid = s.extra.get("xid")
        if isinstance(xid, int):
            codes.add(xid)
    return sorted(codes)


def _lost(sig: FaultSignal) -> bool:
    return any(s.kind is FaultKind.GPU_LOST for s in (sig, *sig.related))


def _node_signal(
    node: str, group: list[FaultSignal], since: float | None, policy: Policy, reported: int
) -> FaultSignal:
    by_gpu: dict[str, FaultSignal] = {}
    for s in sorted(group, key=_start):
        by_gpu.setdefault(str(s.subject.gpu), s)
    gpus = sorted(by_gpu, key=lambda g: (len(g), g))
    xids = {g: _xids(by_gpu[g]) for g in gpus}
    parts = []
    for g in gpus:
        what = ", ".join(f"XID {c}" for c in xids[g]) or "XID"
        if _lost(by_gpu[g]):
            what = f"{what}, lost" if xids[g] else "lost"
        parts.append(f"gpu {g}: {what}")
    starts = [_start(s) for s in group]
    of = f" of {reported}" if reported else ""
    detail = (
        f"{len(gpus)}{of} GPUs of {node} failed within {max(starts) - min(starts):.0f}s: "
        + "; ".join(parts)
    )
    codes = Counter(c for cs in xids.values() for c in cs)
    newest = [n for s in group if isinstance(n := s.extra.get("newest_at"), int | float)]
    extra: dict[str, object] = {
        "gpus": gpus,
        "xids": xids,
        "lost": [g for g in gpus if _lost(by_gpu[g])],
    }
    if codes:
        # the XID most of the GPUs reported: what a drain_node plan names (drain_xids)
        extra["xid"] = max(codes, key=lambda c: (codes[c], c))
    if newest:
        extra["newest_at"] = max(newest)
    evidence = Evidence(
        metric=None,
        # (start of each GPU's fault, its position in ``gpus``): GPU names need not be numbers
        values=tuple((_start(by_gpu[g]), float(i)) for i, g in enumerate(gpus)),
        window_seconds=policy.detection.gpu.correlated.window_seconds,
        detail=detail,
    )
    first = by_gpu[gpus[0]]
    return replace(
        first,
        kind=NODE_KIND,
        subject=Subject(node=node),
        evidence=evidence,
        suggested_tier=policy.tier_rule(NODE_KIND).tier,
        detected_at=max(s.detected_at for s in group),
        since=since,
        step=None,
        extra=extra,
        related=tuple(group),
    )
