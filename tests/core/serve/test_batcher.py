"""The decode thread's batches give Recommender.recommend's lists: deterministically, without HTTP, on both tiny
models, including the lists with near-ties that it decodes again alone."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gencli.core.serve.batcher import (
    TIE_MARGIN,
    TIE_RTOL,
    TIE_RTOL_MAX,
    TIE_RTOL_MIN,
    Batcher,
    Job,
    near_tie,
    tie_tolerance,
)
from gencli.core.serve.metrics import ServeMetrics
from gencli.core.serve.swap import load_served

pytestmark = pytest.mark.usefixtures("one_thread")


def test_near_tie():
    assert near_tie(np.array([-3.0, -3.00001, -5.0], np.float32), 1e-5)
    assert not near_tie(np.array([-3.0, -3.001, -np.inf], np.float32), 1e-5)
    assert not near_tie(np.array([-3.0, -np.inf, -np.inf], np.float32), 1e-5)  # padding is no tie


@pytest.mark.parametrize("wide", [False, True], ids=["measured-tolerance", "widest-tolerance"])
@pytest.mark.parametrize("name", ["a", "b"])
def test_batches_equal_recommend_list_for_list(bundles, recommenders, name, wide):
    served = load_served(bundles[name], device="cpu", decode_batch=8)
    assert TIE_RTOL_MIN <= served.tie_rtol <= TIE_RTOL_MAX
    if wide:  # nearly every list counts as tied: the alone path answers most of them
        served = replace(served, tie_rtol=TIE_RTOL_MAX)
    rec = recommenders[name]
    metrics = ServeMetrics()
    batcher = Batcher(metrics, max_batch=16)
    rng = np.random.default_rng(7)
    histories = [[f"i{i:03d}" for i in rng.integers(0, 40, rng.integers(0, 10))] for _ in range(96)]
    jobs, settled = [], []  # settled: the count of alone decodes when each job got its answer, in answer order
    for start in range(0, len(histories), 16):  # what the decode thread does with a window of 16 requests
        part = [Job(served, served.rec.resolve(h)[0], (10, 5, 25)[i % 3], i % 4 != 0)
                for i, h in enumerate(histories[start:start + 16], start)]
        for job in part:
            job.future.add_done_callback(lambda _, job=job: settled.append((job, metrics.alone.get())))
        batcher._admitted += len(part)
        batcher._decode(part)
        jobs += part
    alone = {id(job) for (job, n), (_, before) in zip(settled, [(None, 0), *settled[:-1]], strict=True) if n > before}
    assert len(alone) == metrics.alone.get()  # each alone decode answered exactly one job
    for history, job in zip(histories, jobs, strict=True):
        items, scores = job.future.result()
        want = rec.recommend(history, k=job.k, exclude_seen=job.exclude_seen)
        assert [rec.item_ids[i] for i in items if i >= 0] == [r.item_id for r in want]
        np.testing.assert_allclose(scores[: len(want)], [r.score for r in want], rtol=TIE_RTOL)
        if id(job) in alone:  # a near-tied list decoded again alone is recommend's list, bit for bit
            assert scores[: len(want)].tolist() == [r.score for r in want]
            assert items[: len(want)].tolist() == [rec.item_ids.index(r.item_id) for r in want]
    assert metrics.batch.count() == 24  # 6 windows x 2 beam widths (k <= 20 share 20 beams) x exclude_seen or not
    if wide:
        assert metrics.alone.get() > 48


def test_tie_tolerance_is_measured_on_the_model(recommenders):
    rec = recommenders["a"]
    tol, seen, probes = tie_tolerance(rec)
    assert (tol, seen, probes) == tie_tolerance(rec) and probes == 32  # seeded probes, all within the budget
    assert tie_tolerance(rec, budget_s=0)[2] == 8  # a slow model: the fewest probes
    assert 0 <= seen < 1e-5  # float32 on a CPU: last bits only
    assert tol == max(TIE_RTOL_MIN, min(TIE_RTOL_MAX, TIE_MARGIN * seen))


def test_a_coarser_dtype_gets_a_larger_tolerance_and_a_warning_past_the_widest(bundles, caplog):
    from gencli.core.serve.swap import log_ties

    fp32 = load_served(bundles["a"], device="cpu")
    bf16 = load_served(bundles["a"], device="cpu", dtype="bfloat16")
    assert bf16.tie_seen > 100 * fp32.tie_seen and bf16.tie_rtol > 100 * fp32.tie_rtol  # 1.7e-4 against 8.8e-8
    too_coarse = replace(bf16, tie_seen=TIE_RTOL_MAX)  # rounding the widest tolerance cannot cover
    with caplog.at_level("INFO", logger="gencli.serve"):
        log_ties(fp32)
        log_ties(bf16)
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
        log_ties(too_coarse)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "ordered differently from Recommender.recommend" in warned[0]
    assert f"tie tolerance {fp32.tie_rtol:.1e}" in caplog.text


def test_a_swap_to_the_same_setup_carries_the_tolerance_and_another_setup_measures_its_own(bundles):
    a = load_served(bundles["a"], device="cpu")
    b = load_served(bundles["b"], device="cpu", like=a)  # another model, the same shapes, dtype and passes
    assert a.tie_probes == 32 and b.tie_probes == 0 and b.numerics == a.numerics
    assert (b.tie_rtol, b.tie_seen) == (a.tie_rtol, a.tie_seen)
    other_passes = load_served(bundles["b"], device="cpu", decode_batch=4, like=a)
    coarser = load_served(bundles["b"], device="cpu", dtype="bfloat16", like=a)
    assert other_passes.tie_probes == coarser.tie_probes == 32
    assert len({a.numerics, other_passes.numerics, coarser.numerics}) == 3
