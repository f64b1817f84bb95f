"""Incidents: what the policy engine decided, written down, and read back.

Write side, all in the caller's transaction (the caller commits, then dispatches):

- ``persist``: one tick's decisions become incident rows, their signals and their plans;
  resolving an incident.
- ``planning``: ``write_plan``, the only writer of recovery action rows (the outbox), used
  by the planner and by the SAFE_MODE release.
- ``timeline``: ``add_event``, the one writer of an incident's timeline (alerts hang off it).
- ``safe_mode_release``: an approver releases a job from SAFE_MODE.

Read side, no writes:

- ``queries``: incidents for the REST API and the dashboard, the engine's restore, the counts
  the metrics export.
- ``public``: the public shapes of incidents, actions and approvals.
"""
