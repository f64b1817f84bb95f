"""Ray-based frameworks (verl, OpenRLHF): their actors watched and healed through Ray.

* :mod:`integrations.ray.presets`: which actor class is which role (verl, openrlhf, a file);
* :mod:`integrations.ray.state`: the state API's actors, nodes and jobs, each call bounded;
* :mod:`integrations.ray.mapping`: actors as participants ``(job, role, rank)``;
* :mod:`integrations.ray.collector`: what the node agent sends (``rlguard agent --ray``);
* :mod:`integrations.ray.hook`: the recovery worker's launcher hook for Ray jobs
  (``restart_role`` = ``ray.kill`` so Ray restarts the actor, ``restart_job`` = the Jobs API);
* :mod:`integrations.ray.verl_log`: verl's file logger lines as job signals (``--verl-log``).

Needs the ``ray`` extra (``pip install 'rlguard[ray]'``); nothing here imports :mod:`app` or
:mod:`agents`, and ``ray`` itself is imported only where a call needs it.
"""
