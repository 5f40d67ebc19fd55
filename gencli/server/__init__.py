"""``gencli serve``'s HTTP server: the Starlette application and uvicorn on a bound socket, with signals.

- :mod:`.app`: the routes, JSON errors and the request checks' 4xx answers;
- :mod:`.service`: :class:`~gencli.server.service.Service`, uvicorn on a socket bound before it starts (SIGTERM
  drains, SIGHUP reloads), connection limits and slow-client timeouts.

What needs no socket (the batcher, the hot swap, request schemas, metrics) is in :mod:`gencli.core.serve`, so it
works and is tested without the ``serve`` extra; this package imports starlette and uvicorn.
"""
