"""The Ray collector's cost at scale: one state API answer with 2,000 actors turned into
participants and samples, against a named baseline measured in the same run.

    .venv/bin/python benchmarks/ray_collector.py                 # 2,000 actors, 50 rounds
    .venv/bin/python benchmarks/ray_collector.py --actors 200 --rounds 5   # smoke run
    .venv/bin/python benchmarks/ray_collector.py --record        # re-record the fixture

The answer is the recorded fixture ``benchmarks/fixtures/ray_state_answer.json``: what Ray
2.60.0's state API returned (``list_actors`` / ``list_nodes`` / ``list_jobs``, ``detail=True``,
as the dicts the HTTP API carries) on a real local Ray running verl-named actors, one of them
killed (its ``death_cause`` included). ``--record`` starts such a Ray and writes it again. The
benchmark scales the recorded actors to ``--actors`` (new ids and names, verl's naming), then
times, per round:

* **collector**: the answer's dicts -> records (``actor_from_dict`` ...), the verl preset's
  mapping, the phases and the samples (``RayCollector.from_snapshot``): all the agent does with
  an answer;
* **baseline (json decode)**: ``json.loads`` of the same answer, the least any client of the
  state API pays for it (the HTTP client decodes it before the collector sees a byte).

Target (issue 19): the collector under 50 ms per answer of 2,000 actors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from integrations.ray.collector import RayCollector  # noqa: E402
from integrations.ray.presets import load_preset  # noqa: E402
from integrations.ray.state import (  # noqa: E402
    ClusterSnapshot,
    actor_from_dict,
    job_from_dict,
    node_from_dict,
)

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ray_state_answer.json"
TARGET_MS = 50.0


def _jsonable(item: Any) -> dict[str, Any]:
    raw = item.asdict() if hasattr(item, "asdict") else dict(vars(item))
    return json.loads(json.dumps(raw, default=lambda v: getattr(v, "value", str(v))))


def record(path: Path) -> None:
    """Start a small local Ray, run verl-named actors, kill one, write the state API's answer."""
    import tempfile

    import ray
    from ray.util.state import list_actors, list_jobs, list_nodes

    from tests.conftest import free_port

    port = free_port()
    ray.init(
        num_cpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=port,
        object_store_memory=80 * 1024 * 1024,
        logging_level="ERROR",
        _temp_dir=tempfile.mkdtemp(prefix="rlgray-", dir="/tmp"),
    )
    try:
        from tests.integration.ray.actors import WorkerDict, vLLMHttpServer

        actors = [WorkerDict.options(name=f"abcWorkerDict_0:{i}").remote() for i in range(2)]
        actors += [vLLMHttpServer.options(name=f"vllm_server_{i}_0").remote() for i in range(2)]
        pids = [ray.get(a.pid.remote()) for a in actors]
        os.kill(pids[-1], signal.SIGKILL)
        address = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listed = list_actors(address=address, detail=True, timeout=5)
            if any(a.state == "DEAD" for a in listed):
                break
            time.sleep(0.2)
        answer = {
            "ray_version": ray.__version__,
            "actors": [_jsonable(a) for a in list_actors(address=address, detail=True, timeout=5)],
            "nodes": [_jsonable(n) for n in list_nodes(address=address, detail=True, timeout=5)],
            "jobs": [_jsonable(j) for j in list_jobs(address=address, detail=True, timeout=5)],
        }
    finally:
        ray.shutdown()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(answer, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"recorded {len(answer['actors'])} actors from Ray {answer['ray_version']} -> {path}")


def scaled_answer(actors: int, fixture: Path = FIXTURE) -> dict[str, Any]:
    """The recorded answer with its actors repeated to ``actors`` (new ids, verl-style names)."""
    recorded = json.loads(fixture.read_text(encoding="utf-8"))
    base = recorded["actors"]
    out = []
    for i in range(actors):
        doc = dict(base[i % len(base)])
        doc["actor_id"] = f"{i:024x}{doc['actor_id'][-8:]}"
        if doc["class_name"] == "WorkerDict":
            doc["name"] = f"abcWorkerDict_{i // 8}:{i % 8}"
        else:
            doc["name"] = f"vllm_server_{i}_0"
        out.append(doc)
    return {"actors": out, "nodes": recorded["nodes"], "jobs": recorded["jobs"]}


def collector_round(answer: dict[str, Any], collector: RayCollector) -> int:
    """What the agent does with one answer; returns the number of participants."""
    snap = ClusterSnapshot(
        actors=tuple(actor_from_dict(a) for a in answer["actors"]),
        nodes=tuple(node_from_dict(n) for n in answer["nodes"]),
        jobs=tuple(job_from_dict(j) for j in answer["jobs"]),
    )
    _samples, participants = collector.from_snapshot(snap, time.time())
    return len(participants)


def measure(actors: int, rounds: int) -> dict[str, float]:
    """Median milliseconds per answer: collector and baseline, interleaved round by round."""
    answer = scaled_answer(actors)
    body = json.dumps(answer)
    collector = RayCollector(load_preset("verl"), job_name="bench")
    assert collector_round(answer, collector) == actors  # warm-up, and every actor is mapped
    ours, base = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        collector_round(answer, collector)
        t1 = time.perf_counter()
        json.loads(body)
        t2 = time.perf_counter()
        ours.append((t1 - t0) * 1000)
        base.append((t2 - t1) * 1000)
    return {"collector_ms": statistics.median(ours), "baseline_ms": statistics.median(base)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--actors", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--record", action="store_true", help="re-record the fixture from a local Ray")
    args = p.parse_args()
    if args.record:
        record(FIXTURE)
        return 0
    # the scaled answer repeats the recorded dead actor: its warning once per copy is noise here
    logging.getLogger("rlguard.agent.ray").setLevel(logging.ERROR)
    got = measure(args.actors, args.rounds)
    ratio = got["collector_ms"] / got["baseline_ms"] if got["baseline_ms"] else float("inf")
    print(f"actors: {args.actors}, rounds: {args.rounds} (median per answer)")
    print(f"collector (records + verl mapping + phases + samples): {got['collector_ms']:.2f} ms")
    print(f"baseline (json decode of the same answer):             {got['baseline_ms']:.2f} ms")
    print(
        f"collector / baseline: {ratio:.2f}x; target < {TARGET_MS:g} ms: "
        f"{'met' if got['collector_ms'] < TARGET_MS else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
