"""Recovery actions: the state machine (``machine``), what each kind does when it finishes
(``kinds``), the one outbox that hands actions and alert deliveries to Celery (``outbox``) and
the worker side that carries an action out (``runner``)."""
