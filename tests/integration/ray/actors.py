"""Actor classes named as verl's and OpenRLHF's are (the presets match the class name), for the
tests on a real local Ray. Each tells its pid; ``Gated`` blocks a restarted instance until the
test opens its gate file, so the test sees Ray's RESTARTING state for as long as it needs."""

from __future__ import annotations

import os
import time

import ray


class _Pid:
    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class vLLMHttpServer(_Pid):  # noqa: N801 - verl's class name
    def __init__(self, gate: str | None = None) -> None:
        if gate and ray.get_runtime_context().was_current_actor_reconstructed:
            while not os.path.exists(gate):
                time.sleep(0.05)


@ray.remote(num_cpus=0)
class WorkerDict(_Pid):
    pass


@ray.remote(num_cpus=0)
class PolicyModelActor(_Pid):
    pass


@ray.remote(num_cpus=0)
class SomethingElse(_Pid):
    pass
