"""Guard-rails on automation: what may run of a plan the policy engine made.

The one entry point is ``gate.gate``, called by the incident writer (``app.incidents.persist``)
before it writes a plan's action rows; it returns a verdict per action with the reason the
timeline shows. The rest are the rails it consults: restart budgets and backoff
(``budget.py``, over ``window.py``), circuit breakers (``breaker.py``, stored so that replicas and
a restarted server agree) and each job's switches, dry run and hands off (``automation.py``).
"""
