"""``rlguard drill``: rehearse a fault on one's own job and see what it costs.

* :mod:`app.drills.rules` — what is refused before anything is sent (role, job, SAFE_MODE,
  another drill in flight, a participant not running);
* :mod:`app.drills.service` — the drill's record: create (audited), read, list, wait for the
  launcher's answer;
* :mod:`app.drills.dispatch` — hand the drill to the Celery worker of the node that runs it;
* :mod:`app.drills.launcher` — on that worker: ask the node's launcher (the launcher hook's
  ``inject_fault``) and record its answer;
* :mod:`app.drills.follow` — after the injection: link the incidents the fault opened (marked
  on their timelines, left out of the ETTR) and write the report when the job trains again;
* :mod:`app.drills.report` — the report from the goodput ledger;
* :mod:`app.drills.public` — what the REST API and the CLI send and get back.
"""
