"""What ``gencli serve`` computes without a socket: batched decoding, the hot-swapped bundle, request checks.

- :mod:`.metrics`: counters, gauges and histograms rendered in the Prometheus text format;
- :mod:`.batcher`: the bounded queue and the one decode thread that batches concurrent requests;
- :mod:`.swap`: the served bundle, reloaded beside the old one when ``--bundle`` moves (or on SIGHUP);
- :mod:`.schema`: request bodies checked field by field (every 4xx names its field).

Nothing here opens a socket or imports click, rich, starlette or uvicorn: the HTTP server that uses these is
:mod:`gencli.server`.
"""
