"""A framework integration for tests: resumes with ``--resumed-from <n>``, and refuses to run
when ``RLGUARD_TEST_INTEGRATION_BROKEN`` is set (an unsupported framework version)."""

from __future__ import annotations

import os


class ResumeIntegration:
    name = "test-resume"
    preload_modules = ("json",)

    def check_environment(self) -> None:
        from integrations import IntegrationError

        if os.environ.get("RLGUARD_TEST_INTEGRATION_BROKEN"):
            raise IntegrationError("test framework 0.1 is not supported (need >= 1.0)")

    def resume_argv(self, argv: list[str]) -> list[str]:
        argv = list(argv)
        if "--resumed-from" in argv:
            i = argv.index("--resumed-from")
            argv[i + 1] = str(int(argv[i + 1]) + 1)
            return argv
        return [*argv, "--resumed-from", "1"]


INTEGRATION = ResumeIntegration()
