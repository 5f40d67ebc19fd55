"""`gencli report`'s readers and the served bundle's watcher, fuzzed like the other readers: an eval metrics.json, a
training step's metrics and metrics.jsonl, and a --promote pointer file, plausible or damaged. A reader never
raises; what it accepts holds only finite numbers where a chart draws one; the watcher's signature of any pointer is
a value (a change is a reload that is logged and counted), never an exception."""

from __future__ import annotations

import json
import math

from fuzz.fuzzing import FUZZ, JSON_VALUE, TEXT, Tally, mostly, replay
from hypothesis import given
from hypothesis import strategies as st

from gencli.flow.report import Problems, ranking, training

NUMBER = st.one_of(st.floats(0, 1), st.integers(0, 100))
BLOCK = st.fixed_dictionaries({"recall@10": mostly(NUMBER, JSON_VALUE), "ndcg@10": mostly(NUMBER, JSON_VALUE),
                               "users": mostly(st.integers(0, 99), JSON_VALUE)})
PLAUSIBLE_EVAL = st.fixed_dictionaries({
    "split": st.just("test"), "users": st.integers(0, 99), "beams": st.integers(1, 20),
    "k": mostly(st.just([10]), JSON_VALUE),
    "metrics": st.fixed_dictionaries({"overall": BLOCK, "head": mostly(BLOCK, JSON_VALUE)}),
    "by_history": mostly(st.dictionaries(st.sampled_from(["gencli", "popularity"]),
                                         mostly(st.dictionaries(st.sampled_from(["1-2", "3-5"]), BLOCK, max_size=2),
                                                JSON_VALUE), max_size=2), JSON_VALUE),
    "other_policy": mostly(st.fixed_dictionaries({"overall": BLOCK}), JSON_VALUE)})


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def test_eval_metrics_never_crash_the_report_and_only_numbers_reach_its_charts(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz-report")
    (work / "eval").mkdir()
    tally = Tally()

    @replay
    @FUZZ
    @given(raw=mostly(PLAUSIBLE_EVAL.map(json.dumps), st.one_of(JSON_VALUE.map(json.dumps), st.binary(max_size=40))))
    def fuzz(raw):
        tally.example()
        (work / "eval" / "metrics.json").write_bytes(raw if isinstance(raw, bytes) else
                                                     raw.encode("utf-8", "surrogatepass"))
        found = ranking(work, "eval", Problems())
        if found is None:
            return
        tally.accept()
        assert found["k"] is None or all(isinstance(k, int) and k > 0 for k in found["k"])
        for policy in found["policies"]:
            assert all(_finite(v) for block in policy["blocks"].values() for v in block.values())
            assert all(_finite(v) for buckets in policy["by_history"].values() for block in buckets.values()
                       for v in block.values())

    fuzz()
    tally.check()


PLAUSIBLE_LINE = st.fixed_dictionaries({"kind": st.sampled_from(["train", "valid"]), "step": st.integers(0, 50),
                                        "loss": mostly(st.floats(0, 10), JSON_VALUE),
                                        "recall@5": mostly(st.floats(0, 1), JSON_VALUE)})


def test_training_records_never_crash_the_report(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz-training")
    (work / "sft").mkdir()
    tally = Tally()

    @replay
    @FUZZ
    @given(metrics=st.fixed_dictionaries({"steps": mostly(st.integers(0, 50), JSON_VALUE),
                                          "peak_step": mostly(st.integers(0, 50), JSON_VALUE),
                                          "average": mostly(st.fixed_dictionaries(
                                              {"members": mostly(st.integers(0, 5), JSON_VALUE)}), JSON_VALUE)}),
           lines=st.lists(mostly(PLAUSIBLE_LINE, JSON_VALUE), max_size=6))
    def fuzz(metrics, lines):
        tally.example()
        (work / "sft" / "step.json").write_text(json.dumps({"metrics": metrics}))
        (work / "sft" / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        found = training(work, "sft", Problems())
        assert found is not None
        tally.accept()
        assert found["kept_step"] is None or isinstance(found["kept_step"], int)
        for row in found["train"] + found["valid"]:
            assert all(_finite(v) for k, v in row.items() if k == "loss" or "@" in k)

    fuzz()
    tally.check()


def test_the_watcher_reads_any_pointer_as_a_signature(bundles, tmp_path_factory):
    from gencli.core.serve.swap import signature

    root = tmp_path_factory.mktemp("fuzz-pointer")
    real = str(bundles["a"].resolve())
    pointer = root / "current"
    tally = Tally()

    named = st.tuples(st.text(" \t", max_size=8), st.sampled_from([real, str(bundles["b"].resolve())]),
                      st.text(" \t\r\n", max_size=8)).map("".join)  # blanks around a path: still that bundle

    @replay
    @FUZZ
    @given(text=mostly(named,
                       st.one_of(TEXT, st.just(str(root / "missing")), st.just(str(pointer)),
                                 st.binary(max_size=40))))
    def fuzz(text):
        tally.example()
        pointer.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        found = signature(pointer)
        assert isinstance(found, tuple) and found
        if found[0] == "unreadable":
            assert isinstance(found[1], str) and found[1]
            return
        tally.accept()
        assert found[0] in (real, str(bundles["b"].resolve()))

    fuzz()
    tally.check()

