"""What every fuzz target shares: how many examples it tries, how a failure is replayed, and how it proves that it
reaches the branch where its safety assertions run.

- Examples: 1,000 per target under ``CI=true``, 100 locally.
- Replay: under ``CI=true`` hypothesis derandomizes (``derandomize=True``: the examples are a function of the test
  alone, so every CI run tries the same ones and a failure there fails again on a rerun with ``CI=true``, on any
  machine). Locally each run draws a fresh seed, which a failure's report names (``GENCLI_FUZZ_SEED=<seed>``):
  set that variable to replay it (with or without CI). ``print_blob`` also prints hypothesis' own
  ``@reproduce_failure`` line. No example database: nothing is replayed from an earlier run's files.
- :class:`Tally`: a target counts the examples its reader accepted and asserts they are at least a quarter of those
  tried (a fuzzer that only ever reaches the refusal proves nothing about what is accepted).
"""

from __future__ import annotations

import os
import random
import string

from hypothesis import HealthCheck, note, seed, settings
from hypothesis import strategies as st

CI = bool(os.environ.get("CI"))
EXAMPLES = 1000 if CI else 100
GIVEN_SEED = os.environ.get("GENCLI_FUZZ_SEED")
SEED = int(GIVEN_SEED or random.SystemRandom().randrange(2**32))
DERANDOMIZE = CI and not GIVEN_SEED
FUZZ = settings(max_examples=EXAMPLES, deadline=None, print_blob=True, database=None, derandomize=DERANDOMIZE,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much])
ACCEPTED_SHARE = 0.25

TEXT = st.one_of(st.text(max_size=12), st.text(alphabet=string.printable, max_size=40),
                 st.sampled_from(["x\r\nSet-Cookie: a=1", "модель", "a" * 5000, "sft@0123456789ab", "", "\x00",
                                  "\ud800", "\x1b[31m", "2026-12-01T02:41:07+0000"]))
JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | TEXT,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                          max_leaves=10)


def mostly(usual: st.SearchStrategy, other: st.SearchStrategy, share: int = 3) -> st.SearchStrategy:
    """``usual`` in ``share`` examples of ``share + 1``, else ``other`` (the branch is drawn first, uniformly: a
    ``one_of`` favours no branch by count)."""
    return st.sampled_from([True] * share + [False]).flatmap(lambda pick: usual if pick else other)


def replay(test):
    """The seed a local run uses (:data:`SEED`); under CI hypothesis derandomizes instead."""
    return test if DERANDOMIZE else seed(SEED)(test)


def note_seed() -> None:
    note("replay: CI=true (derandomized)" if DERANDOMIZE else f"replay: GENCLI_FUZZ_SEED={SEED}")


class Tally:
    """Examples tried and accepted by one target's reader."""

    def __init__(self) -> None:
        self.tried = self.accepted = 0

    def example(self) -> None:
        self.tried += 1
        note_seed()

    def accept(self) -> None:
        self.accepted += 1

    def check(self) -> None:
        assert self.tried >= EXAMPLES // 2, f"only {self.tried} examples ran"
        assert self.accepted >= ACCEPTED_SHARE * self.tried, (
            f"{self.accepted} of {self.tried} examples reached the accepted branch (at least a quarter must)")
