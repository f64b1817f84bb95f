"""Silences, maintenance windows and inhibition: what mutes an incident's alerts or actions.

- ``matchers``: Alertmanager-style label matchers and the labels an incident has.
- ``windows``: when a maintenance window (one-off or weekly) is open.
- ``store``: creating, listing and expiring silences and windows (validated, audited).
- ``muting``: the verdicts the incident writer asks for: is this incident's alert muted
  (silence, maintenance, inhibition), are its actions held.
"""
