"""The TRL integration's standby preload names modules that exist in the supported versions: a
name that stopped existing (a TRL or transformers release moved it) would end every standby in
an ImportError and leave restarts cold."""

from __future__ import annotations

import subprocess
import sys

from integrations.trl import INTEGRATION


def test_every_preload_module_imports_in_a_fresh_interpreter() -> None:
    names = INTEGRATION.preload_modules
    assert {"torch", "transformers", "trl"} <= set(names)
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run(
        [sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
