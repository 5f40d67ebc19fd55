"""``gencli serve``: recommendations over HTTP from an exported bundle, batched and hot-swapped.

- :mod:`.metrics`: counters, gauges and histograms rendered in the Prometheus text format;
- :mod:`.batcher`: the bounded queue and the one decode thread that batches concurrent requests;
- :mod:`.swap`: the served bundle, reloaded beside the old one when ``--bundle`` moves (or on SIGHUP);
- :mod:`.schema`: request bodies checked field by field (every 4xx names its field);
- :mod:`.app`: the Starlette application (routes, JSON errors);
- :mod:`.server`: uvicorn on a bound socket, signals (SIGTERM drains, SIGHUP reloads).

Nothing here imports click or rich; the HTTP stack (starlette, uvicorn) is imported only by :mod:`.app` and
:mod:`.server`, so the rest works without the ``serve`` extra.
"""
