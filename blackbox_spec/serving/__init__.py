"""The parts of ``bspec serve`` (:mod:`blackbox_spec.proxy` is the application):

- :mod:`.requests`: who may call, and what a request asks for (pure);
- :mod:`.admission`: one gate (slots, a queue) for every upstream request;
- :mod:`.answers`: whole answers, event streams and errors, each closing
  its upstream work however the caller leaves;
- :mod:`.passthrough`: requests not speculated on, forwarded unchanged;
- :mod:`.clients`: one client per model and caller, bounded;
- :mod:`.upstream`: what is learned of the upstream beside requests (its
  model list, its token counts);
- :mod:`.tasks`: work started in the background;
- :mod:`.metrics`: ``GET /metrics``.
"""
