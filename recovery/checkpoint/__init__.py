"""Checkpoints that block training for a memory copy and always restore one consistent point.

- :mod:`recovery.checkpoint.engine` — ``CheckpointEngine``: async, crash-safe, verified saves
- :mod:`recovery.checkpoint.version` — ``VersionVector`` and the step ↔ weight-version table
- :mod:`recovery.checkpoint.coordinator` / :mod:`~recovery.checkpoint.participant` — rounds
  (prepare → commit), heartbeats, failure detection (:mod:`~recovery.checkpoint.detector`)
- :mod:`recovery.checkpoint.lease` — coordinator leadership in Redis or PostgreSQL
- :mod:`recovery.checkpoint.restore` — the recovery procedure and its consistency rules
- :mod:`recovery.checkpoint.atomic` — temp → fsync → checksum → rename → marker, reusable by
  other artefacts (the weight-shard snapshots, the TRL integration's checkpoint directories)

Nothing is imported here, so a participant process does not pay for importing torch.
"""

__all__: list[str] = []  # the modules above are the surface
