"""Build hook for the native modules, the rest is configured in pyproject.toml.

Both are optional: where one cannot be built the install goes on and a Python fallback is used.

- ``recovery.transfer._copycrc`` (copy and CRC-32C in one pass, x86-64 with SSE4.2): elsewhere
  ``recovery.transfer.copy_digest`` copies and checksums in two steps.
- ``app.ingest.commit._fsyncd`` (fsync on a native thread, reported on a socket; Linux and other POSIX
  systems): elsewhere the ingest committer fsyncs on a Python thread
  (``app.ingest.commit.loop_fsync``).
"""

import os
import platform

from setuptools import Extension, setup

native = []
if os.name == "posix":
    native.append(
        Extension(
            "app.ingest.commit._fsyncd",
            ["app/ingest/commit/_fsyncd.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    )
if platform.machine().lower() in ("x86_64", "amd64"):
    native.append(
        Extension(
            "recovery.transfer._copycrc",
            ["recovery/transfer/_copycrc.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    )

setup(ext_modules=native)
