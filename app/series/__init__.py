"""The series window: the recent samples of every series, shared by everything that reads them.

Ingest writes into it; the policy engine, the dashboard and the metrics endpoint read it.

- :mod:`app.series.store`: ``SeriesStore``, the bounded in-memory window per series (node,
  metric, labels), thread-safe, with the questions the policy tick asks answered as samples
  arrive (:mod:`app.series.watch`);
- :mod:`app.series.backend`: how the server's replicas share one window (in process, or Redis);
- :mod:`app.series.rollups`: the per-minute rollups written to the database from the window,
  and their retention.
"""
