"""gencli run --previous / --promote on the small sample cut into two days: stable SIDs, reuse, warm start,
promotion, and ``run --json`` printing exactly one object."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from helpers.nights import night, small_night
from safetensors.torch import load_file

from gencli.cli import cli
from gencli.core.infer.promote import decide

pytestmark = pytest.mark.usefixtures("one_thread")

PIPELINE = small_night(rl={"max-steps": 2, "batch-size": 4, "eval-users": 10, "rollouts": 4, "negatives": 2})
DAY1_ITEMS = 30
EDITED = "i0003"


def _run(*args):
    result = CliRunner().invoke(cli, ["run", *args, "--json"])
    return result, json.loads(result.stdout)  # the whole stdout is one JSON object


def _sids(workdir):
    frame = pl.read_parquet(workdir / "quantize" / "sids.parquet")
    return dict(zip(frame["item_id"].to_list(), map(tuple, frame["codes"].to_list()), strict=True))


@pytest.fixture(scope="module")
def two_days(small_sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("retrain")
    link = root / "current"
    night(root, PIPELINE, small_sample.folder, items=DAY1_ITEMS)  # day 1: the first 30 items and their events
    r1, day1 = _run(str(root / "pipeline.toml"), "--workdir", str(root / "day1"), "--promote", str(link))
    assert r1.exit_code == 0, r1.output
    night(root, PIPELINE, small_sample.folder, edit={EDITED: " (2nd edition)"})  # day 2: all (one title edited)
    r2, day2 = _run(str(root / "pipeline.toml"), "--workdir", str(root / "day2"), "--previous", str(link),
                    "--promote", str(link))
    return root, link, (r1, day1), (r2, day2)


def test_run_json_is_one_object_with_every_step(two_days):
    _, _, (_, day1), _ = two_days
    assert day1["status"] == "done"
    assert [s["step"] for s in day1["steps"]] == ["ingest", "embed", "quantize", "init-vocab", "sft", "rl"]
    assert all(s["status"] == "done" and "metrics" in s for s in day1["steps"])


def test_kept_items_keep_their_sid_and_only_new_or_edited_items_are_embedded(two_days):
    root, _, _, (_, day2) = two_days
    before, after = _sids(root / "day1"), _sids(root / "day2")
    kept = before.keys() & after.keys()
    assert kept and all(before[i] == after[i] for i in kept)  # the edited item too: its SID does not move
    report = day2["retrain"]
    assert report["previous"] == str((root / "day1").resolve())  # found through the promoted bundle
    assert (report["items_kept"], report["items_added"], report["items_removed"], report["sid_changed"]) == (
        len(kept), len(after.keys() - before.keys()), len(before.keys() - after.keys()), 0)
    assert report["items_added"] > 0
    assert EDITED in kept
    assert report["embed.items_encoded"] == report["items_added"] + 1  # new items + the edited one
    assert report["embed.items_reused"] == len(after) - report["embed.items_encoded"]


def test_reused_vectors_are_the_previous_ones_exactly(two_days):
    root, *_ = two_days
    ids1 = pl.read_parquet(root / "day1" / "ingest" / "items.parquet")["item_id"].to_list()
    ids2 = pl.read_parquet(root / "day2" / "ingest" / "items.parquet")["item_id"].to_list()
    x1, x2 = (np.load(root / d / "embed" / "embeddings.npy") for d in ("day1", "day2"))
    row1 = {i: r for r, i in enumerate(ids1)}
    same = [i for i in ids2 if i in row1 and i != EDITED]
    assert np.array_equal(x2[[ids2.index(i) for i in same]], x1[[row1[i] for i in same]])
    assert not np.array_equal(x2[ids2.index(EDITED)], x1[row1[EDITED]])


def test_init_vocab_warm_starts_from_the_previous_most_trained_model(two_days):
    root, _, _, (_, day2) = two_days
    init = next(s for s in day2["steps"] if s["step"] == "init-vocab")["metrics"]
    assert init["method"] == "warm_start" and init["warm_start_from"] == str((root / "day1" / "rl").resolve())
    prev = load_file(root / "day1" / "rl" / "model" / "model.safetensors")
    warm = load_file(root / "day2" / "init-vocab" / "model" / "model.safetensors")
    key = "model.embed_tokens.weight"
    n = prev[key].shape[0]
    assert warm[key].shape[0] == n + init["n_new_tokens"]
    assert bool((warm[key][:n] == prev[key]).all())  # every trained row, SID rows included, carried over
    vocab1 = json.loads((root / "day1" / "rl" / "sid_vocab.json").read_text())
    vocab2 = json.loads((root / "day2" / "init-vocab" / "sid_vocab.json").read_text())
    assert all(vocab2["token_ids"][lv][: len(ids)] == ids for lv, ids in enumerate(vocab1["token_ids"]))


def test_promotion_follows_the_documented_rule(two_days):
    root, link, (r1, day1), (r2, day2) = two_days
    first, second = day1["promotion"], day2["promotion"]
    assert first["promoted"] and first["reason"] == "nothing promoted yet"
    bundle = json.loads((root / first["bundle"] / "gencli.json").read_text())
    assert bundle["model_id"].startswith("rl@")  # the most trained model is what is exported and served
    new, cur = second["new"]["recall@10"], second["current_scores"]["recall@10"]
    assert second["promoted"] == (new >= cur * (1 - 0.05))
    assert r2.exit_code == (0 if second["promoted"] else 4)
    expected = second["bundle"] if second["promoted"] else first["bundle"]
    assert os.path.realpath(link) == os.path.realpath(expected)
    log = (root / "current.bundles" / "promotions.jsonl").read_text().splitlines()
    assert [json.loads(line)["promoted"] for line in log] == [True, second["promoted"]]


def test_decide_exact_boundaries():
    assert decide(0.1, None, 0.05) == (True, "nothing promoted yet")
    assert decide(0.095, 0.1, 0.05)[0]  # exactly 5% worse still promotes
    assert not decide(0.0949, 0.1, 0.05)[0]
    assert decide(0.1, 0.1, 0.0)[0] and not decide(0.0999, 0.1, 0.0)[0]


def test_previous_that_does_not_exist_exits_2_before_any_step(two_days, tmp_path):
    root, *_ = two_days
    result = CliRunner().invoke(cli, ["run", str(root / "pipeline.toml"), "--workdir", str(tmp_path / "w"),
                                      "--previous", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "leave --previous out" in result.output
    assert not (tmp_path / "w").exists()


def test_requantize_needs_previous(two_days, tmp_path):
    root, *_ = two_days
    result = CliRunner().invoke(cli, ["run", str(root / "pipeline.toml"), "--workdir", str(tmp_path / "w"),
                                      "--requantize"])
    assert result.exit_code == 2 and "--requantize only applies with --previous" in result.output


def test_bundles_beyond_keep_are_pruned_but_never_the_promoted_one(two_days, tmp_path):
    from gencli.core.infer.promote import prune

    folder = tmp_path / "b"
    for name in ("20260101T000000Z-a", "20260102T000000Z-b", "20260103T000000Z-c", ".partial"):
        (folder / name).mkdir(parents=True)
    removed = prune(folder, 1, [folder / "20260101T000000Z-a"])
    assert removed == ["20260102T000000Z-b"]
    assert sorted(p.name for p in folder.iterdir()) == [".partial", "20260101T000000Z-a", "20260103T000000Z-c"]
    shutil.rmtree(folder)


def test_rerunning_a_finished_night_changes_nothing(two_days):
    root, link, _, (_, day2) = two_days
    before = os.path.realpath(link)
    r, again = _run(str(root / "pipeline.toml"), "--workdir", str(root / "day2"), "--previous", str(link),
                    "--promote", str(link))
    assert [s["status"] for s in again["steps"]] == ["up-to-date"] * 6  # ingest, embed, quantize, init-vocab, sft, rl
    assert again["retrain"]["previous"] == day2["retrain"]["previous"]  # pinned, though the link may have moved
    assert os.path.realpath(link) == before
    if day2["promotion"]["promoted"]:
        assert r.exit_code == 0 and again["promotion"]["reason"].startswith("already promoted")
    else:
        assert r.exit_code == 4 and not again["promotion"]["promoted"]


def test_a_pointer_file_is_switched_and_read_like_a_link(two_days, tmp_path):
    from gencli.core.infer.promote import current_target, switch

    root, link, *_ = two_days
    bundles = sorted(p for p in (root / "current.bundles").iterdir() if p.is_dir())
    pointer = tmp_path / "current.txt"
    pointer.write_text(str(bundles[0]) + "\n")
    assert current_target(pointer) == bundles[0]
    switch(pointer, bundles[-1])
    assert pointer.is_file() and not pointer.is_symlink() and current_target(pointer) == bundles[-1].resolve()
    result = CliRunner().invoke(cli, ["recommend", "--bundle", str(pointer), "--history", "i0001", "--k", "3",
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout.strip().splitlines()[-1])["recommendations"][0]["items"]) == 3


def test_vectors_of_another_encoder_are_not_reused(tmp_path):
    from gencli.core.sid.incremental import PreviousVectors, match_texts

    previous = PreviousVectors(["a", "b"], np.eye(2, dtype=np.float32), {"model": "m", "template": "{title}", "dim": 0,
                                                                          "backend": "torch", "precision": "float32"},
                               tmp_path)
    same = {"model": "m", "template": "{title}", "dim": 0, "backend": "torch", "precision": "float32"}
    assert previous.mismatch(same) is None
    assert match_texts(["b", "c", "a"], previous).tolist() == [1, -1, 0]
    reason = previous.mismatch({**same, "precision": "int8"})
    assert reason and "precision ('float32' -> 'int8')" in reason
