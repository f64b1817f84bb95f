"""A Ray job's driver for the tests, run through the Jobs API as verl's main_ppo would be: it
creates its trainer actor (verl's class and naming) and runs until ``--stop`` exists. Each start
appends its pid and arguments to ``--starts`` (a resubmission shows its resume arguments)."""

from __future__ import annotations

import argparse
import json
import os
import time

import ray

from tests.integration.ray.actors import WorkerDict


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--starts", required=True)
    p.add_argument("--stop", required=True)
    args, overrides = p.parse_known_args()  # Hydra-style overrides (trainer.resume_mode=...)
    ray.init(logging_level="ERROR")
    trainer = WorkerDict.options(name="drvWorkerDict_0:0").remote()
    actor_pid = ray.get(trainer.pid.remote())
    with open(args.starts, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "actor_pid": actor_pid, "argv": overrides}) + "\n")
    while not os.path.exists(args.stop):
        time.sleep(0.1)


if __name__ == "__main__":
    main()
