"""Swap logic without HTTP: a Holder stopped during a reload abandons the load and says so."""

from __future__ import annotations

import threading

import pytest
from helpers.servers import wait_until

pytestmark = pytest.mark.usefixtures("one_thread")

TIMEOUT = 30.0


def test_stopping_during_a_reload_abandons_it_and_says_so(bundles):
    """What `gencli serve` needs to know to leave with os._exit (interpreter shutdown under a torch call aborts)."""
    from gencli.core.serve.metrics import ServeMetrics
    from gencli.core.serve.swap import Holder, load_served

    first = load_served(bundles["a"], device="cpu")
    started, release = threading.Event(), threading.Event()

    def slow_load(path, like=None):  # a real load, held back until the test lets it finish
        started.set()
        release.wait(TIMEOUT)
        return load_served(path, device="cpu", like=like)

    idle = Holder(bundles["a"], first, ServeMetrics(), 0, load=slow_load)
    idle.start()
    assert idle.stop() is True
    holder = Holder(bundles["b"], first, ServeMetrics(), 0, load=slow_load)
    holder.start()
    holder.request_reload()
    assert started.wait(TIMEOUT)
    assert holder.stop(timeout=0.1) is False  # still loading: abandoned
    release.set()
    wait_until(lambda: holder.loads_done == 1, what="the abandoned load to end")
