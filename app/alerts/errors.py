"""Errors raised by the alerting package: one tree rooted at `AlertError`."""

from __future__ import annotations


class AlertError(Exception):
    """Base of every error raised by `app.alerts`."""


class AlertConfigError(AlertError, ValueError):
    """A channel configuration (or a value derived from it) is invalid."""


class AlertEventError(AlertError, ValueError):
    """An `AlertEvent` was built with a bad field; the message names the field and value."""


class HostNotAllowedError(AlertError):
    """A delivery was asked to call a host that no configured channel names."""
