"""What a night leaves for batch consumers and operators: with --promote, recommend runs only once the run's model
serves (a night that is not promoted leaves no recommendations.parquet that looks current), every decision, a no-op
included, is in promotions.jsonl, and the log (stderr off a terminal, --json or not) tells the night's story.

Night 1's events are those with the 12 items most often a validation target of night 2; ingest keeps 10 of them, so
the night-1 bundle's top 10 is its whole catalog less each user's seen items (its training never repeats an item),
and its validation Recall@10 on night 2's users is exactly the share of their unseen targets it knows (28 of 44); an all but untrained night-2 model over 37 items stays far below that
(about 0.3): not promoted, by construction.
"""

from __future__ import annotations

import json
import os
import re

import polars as pl
import pytest
from click.testing import CliRunner
from helpers.nights import night, small_night

from gencli.cli import cli

pytestmark = pytest.mark.usefixtures("one_thread")

PIPELINE = small_night(recommend={"k": 3})


def _run(root, workdir: str, *extra):
    result = CliRunner().invoke(cli, ["run", str(root / "pipeline.toml"), "--workdir", str(root / workdir),
                                      "--promote", str(root / "current"), "--json", *extra])
    return result, json.loads(result.stdout)


@pytest.fixture(scope="module")
def nights(small_sample, tmp_path_factory):
    os.environ.pop("GENCLI_NO_PROGRESS", None)  # the log lines are the subject: CliRunner's stderr is no terminal
    ci = os.environ.pop("CI", None)
    try:
        root = tmp_path_factory.mktemp("promotion")
        probe = root / "probe"  # night 2's validation targets, as ingest splits them
        result = CliRunner().invoke(cli, [*small_sample.ingest_args(), "--workdir", str(probe), "--json"])
        assert result.exit_code == 0, result.output
        valid = pl.read_parquet(probe / "ingest" / "valid.parquet")
        ids = pl.read_parquet(probe / "ingest" / "items.parquet")["item_id"].to_list()
        counts = valid["target"].value_counts().sort(["count", "target"], descending=[True, False])
        top = {ids[i] for i in counts["target"].head(12).to_list()}
        night(root, PIPELINE, small_sample.folder, items=top)
        night1 = _run(root, "night1")
        kept = set(pl.read_parquet(root / "night1" / "ingest" / "items.parquet")["item_id"].to_list())
        assert len(kept) <= 10  # the bundle's top 10 is all it has
        # night 1's training never repeats an item, so it masks each user's seen items (docs/usage.md, repeats)
        share = sum(ids[t] in kept and t not in h for t, h in zip(valid["target"], valid["history"], strict=True)
                    ) / valid.height
        night(root, PIPELINE, small_sample.folder)
        night2 = _run(root, "night2")
        night(root, PIPELINE, small_sample.folder, items=top)
        again = _run(root, "night1")  # night 1 rerun: its bundle still serves, a no-op that the trail records
        yield root, share, night1, night2, again
    finally:
        os.environ["GENCLI_NO_PROGRESS"] = "1"
        if ci is not None:
            os.environ["CI"] = ci


def test_night_one_is_promoted_and_its_log_starts_and_ends_with_timestamped_lines(nights):
    root, _, (result, night1), _, _ = nights
    assert result.exit_code == 0 and night1["promotion"]["promoted"]
    assert [(s["step"], s["status"]) for s in night1["steps"]] == [
        (s, "done") for s in ("ingest", "embed", "quantize", "init-vocab", "sft", "recommend")]
    lines = result.stderr.splitlines()
    stamp = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} "
    assert re.match(stamp + r"gencli run .*pipeline\.toml: started; workdir .*night1; steps ingest, embed", lines[0])
    assert re.match(stamp + r"gencli run: finished, exit 0 after [\d.]+ s; steps: ingest done, .* recommend done; "
                            r"promotion: promoted \(nothing promoted yet\)$", lines[-1]), lines[-1]
    assert lines[-1].endswith(night1["summary"])
    assert any("embedding items: started" in line for line in lines)  # the steps' own progress, though --json
    assert (root / "night1" / "recommend" / "recommendations.parquet").is_file()


def test_a_night_that_is_not_promoted_leaves_no_recommendations(nights):
    root, share, (_, night1), (result, night2), _ = nights
    decision = night2["promotion"]
    assert result.exit_code == 4 and not decision["promoted"]
    assert decision["current_scores"]["recall@10"] == pytest.approx(share) and share > 0.5
    assert night2["steps"][-1] == {**night2["steps"][-1], "step": "recommend", "status": "skipped"}
    assert "not promoted" in night2["steps"][-1]["reason"]
    assert not (root / "night2" / "recommend").exists()  # nothing a loader could take for the serving lists
    assert night2["summary"].endswith("recommend skipped; promotion: not promoted (" + decision["reason"] + ")")
    assert "step recommend: skipped (not promoted)" in result.stderr
    assert result.stderr.splitlines()[-1].split(" ", 3)[3].startswith("gencli run: finished, exit 4")
    assert os.path.realpath(root / "current") == os.path.realpath(night1["promotion"]["bundle"])


def test_the_serving_bundle_scores_tonights_users_and_says_which_model_it_is(nights, tmp_path):
    root, _, (_, night1), _, _ = nights
    current = root / "current"
    serving = json.loads((current / "gencli.json").read_text())["model_id"]
    r = CliRunner().invoke(cli, ["recommend", "--bundle", str(current), "--output", str(tmp_path / "served.parquet"),
                                 "--k", "3"])
    assert r.exit_code == 0, r.output
    served = pl.read_parquet(tmp_path / "served.parquet")  # the users the bundle carries: night 1's
    assert served["user_id"].n_unique() == pl.read_parquet(root / "night1" / "ingest" / "users.parquet").height
    assert set(served["model"]) == {serving} and set(served["run"]) == {str((root / "night1").resolve())}
    recorded = pl.read_parquet(root / "night1" / "recommend" / "recommendations.parquet")
    assert set(recorded["model"]) == {serving}  # night 1's own lists came from the model that serves
    r = CliRunner().invoke(cli, ["recommend", "--bundle", str(current), "--workdir", str(root / "night2"), "--output",
                                 str(tmp_path / "tonight.parquet"), "--k", "3"])
    assert r.exit_code == 0, r.output
    tonight = pl.read_parquet(tmp_path / "tonight.parquet")  # tonight's histories, the serving model
    assert tonight["user_id"].n_unique() == pl.read_parquet(root / "night2" / "ingest" / "users.parquet").height
    assert set(tonight["model"]) == {serving}
    assert "not in the catalog" in r.stderr  # tonight's new items are unknown to yesterday's model, and skipped


def test_every_decision_is_in_the_trail_including_the_no_op(nights):
    root, _, (_, night1), (_, night2), (result, again) = nights
    assert result.exit_code == 0 and again["promotion"]["reason"].startswith("already promoted")
    assert [s["status"] for s in again["steps"]] == ["up-to-date"] * 6
    trail = [json.loads(line) for line in (root / "current.bundles" / "promotions.jsonl").read_text().splitlines()]
    assert [(d["promoted"], d["reason"].split(":")[0].split(" (")[0]) for d in trail] == [
        (True, "nothing promoted yet"), (False, night2["promotion"]["reason"].split(" (")[0]), (True, "already promoted")]
    assert [d["workdir"] for d in trail] == [str((root / n).resolve()) for n in ("night1", "night2", "night1")]
