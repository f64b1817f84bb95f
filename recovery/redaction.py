"""Keep secrets out of text that leaves a process: logs, alerts, a child's output as evidence.

One rule for the whole project: known secret values are replaced by a mask, longest first, so
that a URL that contains a token goes whole rather than leaving its host beside a masked
token. The server registers its webhook secrets (``app/alerts/redaction.py``); the launcher
registers the secrets of the environment it gives a child (:func:`environment_secrets`), so a
training script that prints its Hugging Face or W&B token, or a URL with a password, does not
send it to RLGuard's incidents.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MASK = "***"
# Values shorter than this are not secrets worth a replacement (replacing "1" or "true"
# everywhere would garble the text).
MIN_SECRET_LEN = 8
# Environment variables whose value is a secret, by name (HF_TOKEN, WANDB_API_KEY,
# AWS_SECRET_ACCESS_KEY, RLGUARD_AGENT_TOKEN, PGPASSWORD, ...).
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|ACCESS_?KEY|PRIVATE|CREDENTIAL|AUTH")
# user:password@ in a URL, whatever the password: it need not be in any environment variable.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")


def replace_secrets(value: str, replacements: Mapping[str, str]) -> str:
    """``value`` with every key of ``replacements`` replaced by its mask, longest first."""
    for secret in sorted(replacements, key=len, reverse=True):
        if secret in value:
            value = value.replace(secret, replacements[secret])
    return value


def environment_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """The values of ``env`` whose variable's name says it holds a secret, each to its mask."""
    return {
        value: MASK
        for name, value in env.items()
        if len(value) >= MIN_SECRET_LEN and _SECRET_NAME.search(name.upper())
    }


def redact_text(value: str, replacements: Mapping[str, str]) -> str:
    """:func:`replace_secrets`, and credentials written into a URL (``scheme://user:pw@``)."""
    return _URL_CREDENTIALS.sub(r"\g<scheme>" + MASK + "@", replace_secrets(value, replacements))
