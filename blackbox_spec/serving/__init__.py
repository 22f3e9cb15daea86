"""The parts of ``bspec serve`` (:mod:`blackbox_spec.proxy` is the application):

- :mod:`.requests`: who may call, and what a request asks for (pure);
- :mod:`.admission`: one gate (slots, a queue) for every upstream request;
- :mod:`.answers`: whole answers, event streams and passed-through ones,
  each closing its upstream work however the caller leaves;
- :mod:`.metrics`: ``GET /metrics``.
"""
