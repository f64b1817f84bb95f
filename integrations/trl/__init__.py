"""RLGuard for TRL's ``GRPOTrainer`` (Hugging Face): ``pip install 'rlguard[trl]'``.

Two halves:

* :data:`INTEGRATION` for ``rlguard launch --integration trl``: checks that the installed TRL and
  transformers are versions this integration supports, and on a restart points
  ``--resume_from_checkpoint`` at the newest ``checkpoint-N`` under ``--output_dir`` that has a
  valid completion marker (:mod:`integrations.trl.checkpoints`), never at a torn one.
* :class:`RLGuardCallback` (:mod:`integrations.trl.callback`) for the training script, one line:
  ``GRPOTrainer(..., callbacks=[RLGuardCallback()])``. It imports transformers, so it is loaded
  only when asked for; the launcher side imports neither torch nor transformers.

Supported versions: :data:`SUPPORTED_TRL` and :data:`SUPPORTED_TRANSFORMERS`. The callback sees
the ROLLOUT phase by wrapping the policy model's public ``generate`` method, which TRL's own
(non-vLLM) generation calls on that same model object; that call path, and the checkpoint layout
the markers describe, are what the version range pins.
"""

from __future__ import annotations

import logging
import re
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from integrations import IntegrationError, snapshot_owner
from integrations.trl.checkpoints import newest_complete_checkpoint

if TYPE_CHECKING:
    from integrations.trl.callback import RLGuardCallback

__all__ = [
    "INTEGRATION",
    "SUPPORTED_TRANSFORMERS",
    "SUPPORTED_TRL",
    "RLGuardCallback",
    "TRLIntegration",
    "check_versions",
]

log = logging.getLogger("rlguard.integrations.trl")

# [lowest, first unsupported): the versions this integration is tested with (trl 1.16.0;
# transformers 5.24.0, and 5.19.0, the newest that vLLM 0.32 accepts beside it, which the dev
# install holds). TRL changes its trainer's internals between minor releases, so the next
# minor release is not assumed to work until it has been tried.
SUPPORTED_TRL = ("1.16.0", "1.17")
SUPPORTED_TRANSFORMERS = ("5.19.0", "6")

RESUME_FLAG = "--resume_from_checkpoint"
# The directory name a snapshot is resumed through (integrations.trl.snapshots.RESUME_PREFIX).
SNAPSHOT_RESUME_PREFIX = "rlguard-snapshot-"
_OUTPUT_FLAGS = ("--output_dir", "--output-dir")


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        raise IntegrationError(
            f"the TRL integration needs {package}, which is not installed: "
            f"pip install 'rlguard[trl]'"
        ) from None


def _release(text: str) -> tuple[int, ...] | None:
    """The release numbers of a PEP 440 version (``"1.16.0.dev0"`` -> ``(1, 16, 0)``). A
    pre-release of a supported version compares equal to it: close enough for a range check,
    and no dependency on ``packaging`` on the launcher side."""
    match = re.match(r"^v?(\d+(?:\.\d+)*)", text.strip())
    if match is None:
        return None
    numbers = [int(part) for part in match.group(1).split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()  # 1.16.0 == 1.16
    return tuple(numbers)


def _check_range(package: str, installed: str, supported: tuple[str, str]) -> None:
    low, high = supported
    version = _release(installed)
    if version is None:
        raise IntegrationError(f"{package} {installed!r} is not a version this can read")
    if not (_release(low) or ()) <= version < (_release(high) or ()):
        raise IntegrationError(
            f"{package} {installed} is not supported by the RLGuard TRL integration "
            f"(supported: {package}>={low},<{high}); install those, e.g. pip install 'rlguard[trl]'"
        )


def check_versions() -> dict[str, str]:
    """The installed ``{"trl": ..., "transformers": ...}``; raises :class:`IntegrationError`
    with one line when either is missing or outside the supported range."""
    versions = {"trl": _installed("trl"), "transformers": _installed("transformers")}
    _check_range("trl", versions["trl"], SUPPORTED_TRL)
    _check_range("transformers", versions["transformers"], SUPPORTED_TRANSFORMERS)
    return versions


def _flag_value(argv: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the last of ``flags`` in ``argv`` (``--flag v`` or ``--flag=v``)."""
    value = None
    for i, arg in enumerate(argv):
        for flag in flags:
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(flag + "="):
                value = arg[len(flag) + 1 :]
    return value


def _without_flag(argv: list[str], flag: str) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return out


class TRLIntegration:
    """What ``rlguard launch --integration trl`` needs to know about a TRL training script."""

    name = "trl"
    # rlguard launch owns a memory segment for the trainers' every-step snapshots
    # (integrations.snapshot_owner; taken by integrations.trl.snapshots.enable_snapshots).
    memory_snapshots = True
    # What a warm standby of ``rlguard launch --standby`` imports ahead (the slow part of a start).
    # transformers and trl load their classes lazily: importing the packages alone left a GRPO
    # script's own imports (the model class, GRPOTrainer, datasets) 1.70 s of the restart; with
    # the modules below behind them 0.03 s (examples/trl_grpo/train.py, idle, this machine). The
    # model's own module (e.g. modeling_qwen2) is small once modeling_utils is loaded.
    preload_modules = (
        "torch",
        "transformers",
        "transformers.modeling_utils",
        "transformers.trainer",
        "trl",
        "trl.trainer.grpo_trainer",
        "datasets",
    )
    # What the standby runs once imported: a throwaway GRPO step on a tiny model of its own
    # (every RNG state restored), paying the first step's once-only op and kernel set-up
    # (benchmarks/trl_first_step.py; docs/integrations.md, Warm standby).
    standby_warmup = ("integrations.trl.warmup:warm_up",)

    def check_environment(self) -> None:
        """Raise :class:`IntegrationError` unless supported TRL and transformers are installed."""
        check_versions()

    def resume_argv(self, argv: list[str]) -> list[str]:
        """``argv`` with ``--resume_from_checkpoint`` set to the newest committed state (any
        given value replaced): the newest memory or disk snapshot of this launch
        (``<output_dir>/rlguard-snapshot-<step>``, which the trainer's ``enable_snapshots``
        writes before training; with several ranks the newest step a round committed that
        every rank holds) or the newest complete ``checkpoint-N`` under ``--output_dir``,
        whichever is the later step (a snapshot on a tie); unchanged when there is none."""
        output_dir = _flag_value(argv, _OUTPUT_FLAGS)
        if output_dir is None:
            log.warning("no --output_dir in the command: cannot find checkpoints to resume from")
            return list(argv)
        newest = newest_complete_checkpoint(Path(output_dir))
        owner = snapshot_owner.active()
        # Several ranks: the newest step every rank holds and a round committed.
        snapshot = owner.resume_step() if owner is not None else None
        if snapshot is not None and (newest is None or snapshot >= newest.global_step):
            path = Path(output_dir) / f"{SNAPSHOT_RESUME_PREFIX}{snapshot}"
            return [*_without_flag(argv, RESUME_FLAG), RESUME_FLAG, str(path)]
        if newest is None:
            return list(argv)
        return [*_without_flag(argv, RESUME_FLAG), RESUME_FLAG, str(newest.path)]


INTEGRATION = TRLIntegration()


def __getattr__(name: str) -> Any:
    # The callback imports transformers (seconds); the launcher never needs it.
    if name == "RLGuardCallback":
        from integrations.trl.callback import RLGuardCallback

        return RLGuardCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
