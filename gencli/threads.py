"""How many CPU threads torch may use: the bounds and the default of a query, shared by the CLI and the Python API.

No torch here: ``gencli --help`` reads it. :func:`gencli.core.device.set_threads` applies a count.
"""

from __future__ import annotations

MAX_THREADS = 4096  # --threads and Recommender.load(threads=) at most (torch refuses absurd counts with a traceback)
# torch CPU threads of a query: Recommender.load's default, and gencli recommend's (with a selector) and gencli
# serve's when neither --threads nor $GENCLI_THREADS is given. One small decode gains little from a second thread on
# an idle machine and loses 10-50x when another job holds the cores (docs/usage.md, "Recommendations from Python").
QUERY_THREADS = 1


def thread_problem(value: object) -> str | None:
    """What is wrong with a thread count (a whole number in [0, MAX_THREADS]; 0 = torch's default), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{value!r} is not a whole number; give a number of CPU threads, or 0 for torch's default"
    if value < 0:
        return f"{value} is negative; use 0 for torch's default or a positive number of CPU threads"
    if value > MAX_THREADS:
        return f"{value} is more than {MAX_THREADS}; give the CPU threads a job may use"
    return None
