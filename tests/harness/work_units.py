"""How a pytest-xdist run cuts the suite into units of work (``scripts/test.sh`` runs
``--dist loadfile``): a test file is a unit, except that every file starting real vLLM engines
is one unit together, so those files run one after another in one worker.

Side by side (the slow files all start first) four cold engine starts on two cores once took over
the engine host's 300 s start limit in CI, and a test then saw its job give up. xdist's own
``loadgroup`` would say this with a marker, but it renames the item's ``_nodeid``, which pytest 9
no longer reads; the controller collects nothing, so the files are named here by path, and each
worker checks that the ``vllm`` marker and this list agree."""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadFileScheduling

VLLM_UNIT = "vllm-engines"
VLLM_FILES = frozenset(
    {
        "tests/integration/engines/test_engine_health_live.py",
        "tests/integration/engines/test_refit_direct.py",
        "tests/integration/engines/test_vllm_server.py",
        "tests/integration/integrations/test_trl_vllm_healed.py",
        "tests/integration/integrations/test_trl_vllm_server.py",
        "tests/integration/workload/test_vllm_engines.py",
        "tests/integration/workload/test_vllm_engines_on_ray.py",
    }
)


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class FilesWithVllmAsOneUnit(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
        path = file_of(nodeid)
        return VLLM_UNIT if path in VLLM_FILES else path


def check_vllm_files(items: list[pytest.Item]) -> None:
    """Fails the run if a file marked ``vllm`` is missing from VLLM_FILES (or one listed there
    lost its marker): the list must say which files start engines."""
    marked = {file_of(item.nodeid) for item in items if item.get_closest_marker("vllm")}
    collected = {file_of(item.nodeid) for item in items}
    unlisted = marked - VLLM_FILES
    unmarked = (VLLM_FILES & collected) - marked
    if unlisted or unmarked:
        raise pytest.UsageError(
            "tests/harness/work_units.py: VLLM_FILES and the `vllm` marker disagree"
            f" (marked, not listed: {sorted(unlisted)}; listed, not marked: {sorted(unmarked)})"
        )
