"""The output of a renderer: the JSON bodies to post, in order, and helpers to size them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

ChannelType = Literal["slack", "wecom", "webhook"]


@dataclass(frozen=True, slots=True)
class RenderedMessage:
    """One message for one channel; WeCom's heavy tier needs two posts (markdown + mention)."""

    channel_type: ChannelType
    parts: tuple[dict[str, Any], ...]


def encode_body(part: dict[str, Any]) -> bytes:
    """The exact bytes posted (and, for the generic webhook, signed)."""
    return json.dumps(part, ensure_ascii=False, separators=(",", ":"), sort_keys=False).encode(
        "utf-8"
    )


def truncate_utf8(value: str, max_bytes: int, *, suffix: str = "…") -> str:
    """`value` cut to at most `max_bytes` of UTF-8, on a character boundary, ending in `suffix`."""
    encoded = value.encode("utf-8")
    if len(encoded) <= max_bytes:
        return value
    room = max_bytes - len(suffix.encode("utf-8"))
    if room <= 0:
        return suffix.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")
    # errors="ignore" drops the partial multi-byte character the byte cut may have split.
    return encoded[:room].decode("utf-8", errors="ignore") + suffix


def truncate_chars(value: str, max_chars: int) -> str:
    return value if len(value) <= max_chars else value[: max_chars - 1] + "…"
