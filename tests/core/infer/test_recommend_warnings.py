"""A warning from Recommender (unknown ids in a history) points at the caller's line, whichever method it called."""

from __future__ import annotations

import warnings

import pytest

from gencli import Recommender

pytestmark = pytest.mark.usefixtures("one_thread")


def test_unknown_ids_warn_at_the_callers_line(trained_small):
    rec = Recommender.load(trained_small / "bundle", device="cpu")
    known = rec.item_ids[0]
    for call in (lambda: rec.recommend([known, "no-such-item"], k=3),
                 lambda: rec.recommend_batch([[known], ["no-such-item"]], k=3)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        [warning] = [w for w in caught if "not in the catalog" in str(w.message)]
        assert warning.filename == __file__, (warning.filename, warning.lineno)
        assert "no-such-item" in str(warning.message)
