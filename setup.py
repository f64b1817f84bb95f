"""Build hook for the one native module, the rest is configured in pyproject.toml.

``recovery.transfer._copycrc`` (copy and CRC-32C in one pass, x86-64 with SSE4.2) is optional:
where it cannot be built (another architecture, no C compiler) the install goes on and
``recovery.transfer.copy_digest`` copies and checksums in two steps instead.
"""

import platform

from setuptools import Extension, setup

native = []
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
