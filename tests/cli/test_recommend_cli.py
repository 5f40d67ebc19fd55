"""gencli recommend and gencli export end to end on a tiny trained workdir."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import polars as pl
import pytest
from click.testing import CliRunner

from gencli.cli import cli

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(workdir, *args, input=None):
    return CliRunner().invoke(cli, [*args, "--workdir", str(workdir)], input=input)


def _json(result):
    return json.loads(result.stdout.strip().splitlines()[-1])


def _model_id(workdir, step="sft"):
    """docs/formats.md: the step, then 12 hex digits of the sha256 over its model/ files, sid_vocab.json,
    blend.json and item_prior.npy."""
    import hashlib

    outputs = json.loads((workdir / step / "step.json").read_text())["outputs"]
    listing = sorted((o["path"], o["sha256"]) for o in outputs
                     if o["path"].startswith("model/") or o["path"] in ("sid_vocab.json", "blend.json", "item_prior.npy"))
    return f"{step}@" + hashlib.sha256("".join(f"{p}\t{d}\n" for p, d in listing).encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def trained(small_sample, tmp_path_factory):
    """The small sample (40 items, 51 users): every-user commands stay quick."""
    wd = tmp_path_factory.mktemp("recommend") / "work"
    for args in (small_sample.ingest_args(), ["embed"], ["quantize", "--levels", "2", "--codes", "8"],
                 ["init-vocab", "--model", "tiny"],
                 ["sft", "--max-steps", "8", "--batch-size", "16", "--max-history", "5", "--eval-users", "10",
                  "--eval-beams", "10"],
                 ["eval", "--beams", "20", "--k", "10", "--max-users", "8"]):
        result = _run(wd, *args, "--json")
        assert result.exit_code == 0, result.output
    return wd


@pytest.fixture(scope="module")
def catalog(trained):
    items = pl.read_parquet(trained / "ingest" / "items.parquet")
    events = pl.read_parquet(trained / "ingest" / "interactions.parquet")
    ids = items["item_id"].to_list()
    seen = {u: {ids[i] for i in g["item_idx"].to_list()} for (u,), g in events.group_by("user_id")}
    return ids, seen


def test_recommend_step_writes_every_users_top_k_unseen(trained, catalog):
    ids, seen = catalog
    result = _run(trained, "recommend", "--k", "7", "--json")
    assert result.exit_code == 0, result.output
    payload = _json(result)
    assert payload["status"] == "done" and payload["metrics"]["users"] == len(seen)
    assert payload["metrics"]["max_history"] == 5  # as sft trained
    recs = pl.read_parquet(trained / "recommend" / "recommendations.parquet")
    assert recs.columns == ["user_id", "rank", "item_id", "score", "title", "model"]
    assert set(recs["model"]) == {_model_id(trained)} == {payload["metrics"]["model"]}  # which model made it
    per_user = recs.group_by("user_id").agg(pl.col("item_id"), pl.col("rank"), pl.col("score"))
    assert per_user.height == len(seen)
    for row in per_user.iter_rows(named=True):
        assert len(set(row["item_id"])) == 7 and sorted(row["rank"]) == list(range(1, 8))
        assert not set(row["item_id"]) & seen[row["user_id"]]
    again = _run(trained, "recommend", "--k", "7", "--json")
    assert _json(again)["status"] == "up-to-date"


def test_include_seen_matches_evals_ranking(trained, catalog):
    ids, _ = catalog
    preds = pl.read_parquet(trained / "eval" / "predictions.parquet")
    test = pl.read_parquet(trained / "ingest" / "test.parquet")
    for row in preds.head(3).iter_rows(named=True):
        history = test.filter(pl.col("user_idx") == row["user_idx"])["history"].to_list()[0]
        result = _run(trained, "recommend", "--history", ",".join(ids[i] for i in history), "--include-seen",
                      "--k", "10", "--beams", "20", "--json")
        assert result.exit_code == 0, result.output
        got = [item["item_id"] for item in _json(result)["recommendations"][0]["items"]]
        assert got == [ids[i] for i in row["items"]]
    assert not (trained / ".staging" / "recommend").exists()


def test_eval_measures_what_recommend_serves_next_to_the_baselines(trained, catalog):
    ids, seen = catalog
    r = _run(trained, "eval", "--beams", "20", "--k", "10", "--max-users", "8", "--exclude-seen", "--force", "--json")
    assert r.exit_code == 0, r.output
    metrics = _json(r)["metrics"]
    assert metrics["exclude_seen"] is True and metrics["ranking"] == json.loads(
        (trained / "sft" / "blend.json").read_text())["blends"]["exclude_seen"]
    for block in ("popularity_baseline", "content_baseline", "model_only"):
        assert metrics[block]["users"] == 8
    assert set(metrics["vs_content"]) == {"recall@10", "ndcg@10"}
    preds = pl.read_parquet(trained / "eval" / "predictions.parquet")
    test = pl.read_parquet(trained / "ingest" / "test.parquet")
    for row in preds.iter_rows(named=True):  # seen items are masked inside the decoder, as recommend does
        history = test.filter(pl.col("user_idx") == row["user_idx"])["history"].to_list()[0]
        assert not set(row["items"]) & set(history) and len(set(row["items"])) == 10
        got = _json(_run(trained, "recommend", "--history", ",".join(ids[i] for i in history), "--k", "10",
                         "--beams", "20", "--json"))["recommendations"][0]["items"]
        assert [item["item_id"] for item in got] == [ids[i] for i in row["items"]]
    plain = _run(trained, "eval", "--beams", "20", "--k", "10", "--max-users", "8", "--ranking", "model", "--force",
                 "--json")
    assert _json(plain)["metrics"]["ranking"] == {"weight": 1.0, "prefix": 0.0, "temperature": 0.2}
    assert _json(plain)["metrics"]["overall"] == _json(plain)["metrics"]["model_only"]
    bad = _run(trained, "eval", "--ranking", "mixed")
    assert bad.exit_code == 2 and "mixed" in bad.output


def test_stdin_keeps_order_and_matches_user_mode(trained, catalog):
    ids, seen = catalog
    users = sorted(seen)[:3]
    lines = [{"user_id": users[2]}, {"user_id": "new", "history": [ids[0], ids[1]]}, {"user_id": users[0]}]
    result = _run(trained, "recommend", "--stdin", "--output", "-", "--k", "4",
                  input="".join(json.dumps(x) + "\n" for x in lines))
    assert result.exit_code == 0, result.output
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert [a["user_id"] for a in answers] == [users[2], "new", users[0]]
    assert all(len(a["items"]) == 4 and set(a["items"][0]) == {"item_id", "score", "title", "rank"} for a in answers)
    assert all([i["rank"] for i in a["items"]] == [1, 2, 3, 4] for a in answers)
    assert {a["model"] for a in answers} == {_model_id(trained)}  # each line says which model answered
    assert answers[1]["history_used"] == 2 and answers[0]["run"] == str(trained.resolve()) and answers[0]["created"]
    assert not {i["item_id"] for i in answers[1]["items"]} & {ids[0], ids[1]}
    single = _json(_run(trained, "recommend", "--user", users[0], "--k", "4", "--json"))
    alone, batched = single["recommendations"][0]["items"], answers[2]["items"]  # padding moves scores by ~1e-7
    assert [i["item_id"] for i in alone] == [i["item_id"] for i in batched]
    assert [i["score"] for i in alone] == pytest.approx([i["score"] for i in batched], abs=1e-4)


def test_output_files_by_extension(trained, tmp_path):
    for name in ("r.parquet", "r.csv", "r.jsonl"):
        result = _run(trained, "recommend", "--output", str(tmp_path / name), "--k", "3")
        assert result.exit_code == 0, result.output
    parquet = pl.read_parquet(tmp_path / "r.parquet")
    assert parquet.columns == ["user_id", "rank", "item_id", "score", "title", "model", "run", "created"]
    assert parquet["run"].unique().to_list() == [str(trained.resolve())] and parquet["created"].n_unique() == 1
    same = parquet.drop("created")  # each query says when it ran
    assert same.equals(pl.read_csv(tmp_path / "r.csv", schema=parquet.schema).drop("created"))
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) * 3 == parquet.height
    assert [i["item_id"] for i in json.loads(lines[0])["items"]] == parquet["item_id"].head(3).to_list()
    result = _run(trained, "recommend", "--output", str(tmp_path / "rows.jsonl"), "--k", "3", "--jsonl-shape", "item")
    assert result.exit_code == 0, result.output
    rows = pl.read_ndjson(tmp_path / "rows.jsonl", schema=parquet.schema)  # one row per item, as the table
    assert rows.drop("created").equals(same)
    bad = _run(trained, "recommend", "--output", str(tmp_path / "r.xlsx"))
    assert bad.exit_code == 2 and ".parquet, .csv or .jsonl" in bad.output


def test_bad_ids_strict_empty_history_and_bad_lines(trained, catalog):
    ids, _ = catalog
    r = _run(trained, "recommend", "--user", "nobody", "--user", "nobody2")
    assert r.exit_code == 2 and "2 user id(s) are not in the workdir: nobody, nobody2" in r.output
    r = _run(trained, "recommend", "--history", f"{ids[0]},zz9", "--strict")
    assert r.exit_code == 2 and "--strict: 1 history item id(s) are not in the catalog: zz9" in r.output
    r = _run(trained, "recommend", "--history", f"{ids[0]},zz9", "--k", "3", "--json")
    assert r.exit_code == 0 and _json(r)["skipped_ids"] == 1 and "skipped 1 distinct history item id" in r.stderr
    r = _run(trained, "recommend", "--history", "", "--k", "5", "--json")
    assert r.exit_code == 0 and len(_json(r)["recommendations"][0]["items"]) == 5
    r = _run(trained, "recommend", "--stdin", input='{"history": ["a"]}\nnot json\n[1]\n{"history": "i1"}\n')
    assert r.exit_code == 2
    assert "3 bad line(s)" in r.output and "line 2: not JSON" in r.output and "line 4" in r.output
    r = _run(trained, "recommend", "--k", "1000000000", "--beams", "1000000000")  # grew to 22.8 GB before
    assert r.exit_code == 2 and "--beams must be <= 4096" in r.output
    r = _run(trained, "recommend", "--history", ids[0], "--k", "1000000000", "--json")  # capped by the catalog
    assert r.exit_code == 0 and len(_json(r)["recommendations"][0]["items"]) == len(ids) - 1
    r = _run(trained, "recommend", "--k", "30", "--beams", "10")
    assert r.exit_code == 2 and "--beams (10) must be >= --k (30)" in r.output
    r = _run(trained, "recommend", "--history", ids[0], "--stdin")
    assert r.exit_code == 2 and "at most one of --history, --stdin" in r.output
    assert not (trained / "recommend" / "step.json").exists() or json.loads(
        (trained / "recommend" / "step.json").read_text())["status"] == "done"


def test_stdin_bytes_deep_lines_unknown_counts_and_control_codes(trained, catalog):
    """Non-UTF-8 --stdin bytes were written back as invalid JSON; the warning counted occurrences; escape
    sequences in titles reached the terminal raw."""
    from gencli.ui.recommendations import printable

    ids, _ = catalog
    raw = b'{"history": ["' + ids[0].encode() + b'", "\xff\xfe"]}\n'
    r = CliRunner().invoke(cli, ["recommend", "--stdin", "--workdir", str(trained)], input=raw)
    assert r.exit_code == 2 and "line 1" in r.output and "UTF-8" in r.output, r.output
    deep = '{"history": ' + "[" * 50000 + "]" * 50000 + "}\n"
    r = _run(trained, "recommend", "--stdin", input=deep)
    assert r.exit_code == 2 and "line 1: nested too deeply" in r.output and "Traceback" not in r.output
    r = _run(trained, "recommend", "--history", f"{ids[0]},zz9,zz9,zz9,qq1", "--k", "3", "--json")
    assert r.exit_code == 0 and "skipped 2 distinct history item id(s) not in the catalog (4 occurrences)" in r.stderr
    assert printable("A\x1b[31mred\x1b[0m [b]x[/b]") == "A\\x1b[31mred\\x1b[0m \\[b]x\\[/b]"


def test_export_bundle_answers_in_a_fresh_process_without_workdir(trained, catalog, tmp_path):
    ids, _ = catalog
    out = tmp_path / "shop"
    r = _run(trained, "export", str(out), "--json")
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "gencli.json").read_text())
    assert meta["source"]["model_step"] == "sft" and meta["decode"]["max_history"] == 5
    # the source workdir is recorded as provenance only (what `run --previous BUNDLE` follows); nothing else names it
    assert meta["source"].pop("workdir") == str(trained.resolve())
    assert "eval" in meta["metrics"] and str(trained) not in json.dumps(meta)
    assert (out / "blend.json").read_bytes() == (trained / "sft" / "blend.json").read_bytes()  # it ranks alike
    assert (out / "embeddings.npy").is_file() and "blend.json" in meta["sha256"]
    history = ",".join(ids[3:9])
    in_workdir = _json(_run(trained, "recommend", "--history", history, "--k", "6", "--json"))
    env = {k: v for k, v in os.environ.items() if k != "GENCLI_WORKDIR"}
    done = subprocess.run([sys.executable, "-m", "gencli", "recommend", "--bundle", str(out), "--history", history,
                           "--k", "6", "--json"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["recommendations"] == in_workdir["recommendations"]
    assert not (tmp_path / "gencli-work").exists()
    again = _run(trained, "export", str(out))
    assert again.exit_code == 2 and "not empty" in again.output
    holder = _run(trained, "export", str(trained.parent), "--force")  # once deleted the workdir inside it
    assert holder.exit_code == 2 and "holds the workdir" in holder.output and (trained / "manifest.json").exists()
    (out / "model" / "config.json").write_text("{}")
    broken = _run(trained, "recommend", "--bundle", str(out), "--history", history)
    assert broken.exit_code == 2 and "re-export it" in broken.output and "Traceback" not in broken.output

def _bundle(bundle, *args, input=None):
    """recommend --bundle with no workdir at all (the workdir fixture is elsewhere)."""
    return CliRunner().invoke(cli, ["recommend", "--bundle", str(bundle), *args], input=input)


def test_a_bundle_scores_every_user_as_its_workdir_does(trained, catalog, tmp_path):
    """export carries the users' histories: `recommend --bundle B --output FILE` is the batch of the serving model,
    and every output names the model that made it (the bundle's model_id, the workdir's model step)."""
    ids, seen = catalog
    out = tmp_path / "shop"
    assert _run(trained, "export", str(out), "--json").exit_code == 0
    meta = json.loads((out / "gencli.json").read_text())
    assert "users.parquet" in meta["files"] and "users.parquet" in meta["sha256"]
    assert "lexical.npz" in meta["sha256"]  # the text's word-match side travels, mixed as sft fitted it
    assert (out / "lexical.npz").read_bytes() == (trained / "embed" / "lexical.npz").read_bytes()
    from gencli.core.infer.recommend import Recommender

    scorer = Recommender.load(out).ranker.scorer
    fitted = json.loads((trained / "sft" / "blend.json").read_text())["text"]["dense_share"]
    assert scorer.lexical is not None and scorer.dense_share == fitted
    r = _run(trained, "recommend", "--output", str(tmp_path / "workdir.parquet"), "--k", "4")
    assert r.exit_code == 0, r.output
    r = _bundle(out, "--output", str(tmp_path / "bundle.parquet"), "--k", "4")
    assert r.exit_code == 0, r.output
    r = _run(trained, "recommend", "--bundle", str(out), "--output", str(tmp_path / "both.parquet"), "--k", "4")
    assert r.exit_code == 0, r.output  # the bundle's model, the workdir's histories: here the same ones
    a, b = (pl.read_parquet(tmp_path / f"{w}.parquet") for w in ("workdir", "bundle"))
    assert pl.read_parquet(tmp_path / "both.parquet").drop("created").equals(b.drop("created"))
    assert a.height == 4 * len(seen) and a["user_id"].n_unique() == len(seen)
    assert a.select("user_id", "rank", "item_id", "title", "model", "run").equals(
        b.select("user_id", "rank", "item_id", "title", "model", "run"))
    assert b["score"].to_list() == pytest.approx(a["score"].to_list(), abs=1e-4)
    assert set(b["model"]) == {meta["model_id"]} == {_model_id(trained)}
    user = sorted(seen)[0]
    one = _json(_bundle(out, "--user", user, "--k", "4", "--json"))
    assert [i["item_id"] for i in one["recommendations"][0]["items"]] == \
        a.filter(pl.col("user_id") == user)["item_id"].to_list()
    assert one["model"] == meta["model_id"] and one["run"] == str(trained.resolve())
    r = _bundle(out, "--user", "nobody-knows")
    assert r.exit_code == 2 and "not in the bundle" in r.output
    bare = tmp_path / "bare"
    assert _run(trained, "export", str(bare), "--no-users").exit_code == 0
    assert not (bare / "users.parquet").exists()
    r = _bundle(bare, "--output", str(tmp_path / "x.parquet"))
    assert r.exit_code == 2 and "carries no user histories" in r.output
    r = _bundle(bare, "--history", ids[0], "--json")
    assert r.exit_code == 0, r.output
    r = _bundle(bare, "--history", ids[0], "--workdir", str(tmp_path / "none"), "--json")
    assert r.exit_code == 0, r.output  # explicit histories: the workdir is not read
    r = _bundle(bare)
    assert r.exit_code == 2 and "--output FILE for every user the bundle carries" in r.output


def test_a_history_of_unknown_ids_only_is_flagged(trained, catalog):
    ids, _ = catalog
    r = _run(trained, "recommend", "--stdin", "--output", "-", "--k", "3",
             input=json.dumps({"user_id": "x", "history": ["nope-1", "nope-2"]}) + "\n"
             + json.dumps({"user_id": "y", "history": [ids[0], "nope-3"]}) + "\n")
    assert r.exit_code == 0, r.output
    x, y = (json.loads(line) for line in r.stdout.splitlines())
    assert (x["history_used"], x["skipped"]) == (0, ["nope-1", "nope-2"]) and y["history_used"] == 1
    assert "1 user(s) had only unknown history ids" in r.stderr
    r = _run(trained, "recommend", "--history", "nope-1", "--json")
    assert _json(r)["unconditional_users"] == 1


def test_user_file_and_prune(trained, catalog, tmp_path):
    ids, seen = catalog
    users = sorted(seen)[3:5]
    (tmp_path / "users.txt").write_text("\n".join(users) + "\n\n")
    r = _run(trained, "recommend", "--user-file", str(tmp_path / "users.txt"), "--k", "3", "--json")
    assert r.exit_code == 0, r.output
    assert [a["user_id"] for a in _json(r)["recommendations"]] == users
    r = _run(trained, "recommend", "--user-file", str(tmp_path / "none.txt"))
    assert r.exit_code == 2 and "does not exist" in r.output
    history = ",".join(ids[:12])
    r = _run(trained, "recommend", "--history", history, "--prune", "--recent-window", "4", "--max-history", "12",
             "--k", "5", "--json")
    assert r.exit_code == 0, r.output
    items = [i["item_id"] for i in _json(r)["recommendations"][0]["items"]]
    assert len(set(items)) == 5 and not set(items) & set(ids[:12])


def test_docs_formats_md_describes_metrics_json_as_eval_writes_it(trained):
    """The page showed `overall` at the top of metrics.json; it sits under `metrics` (step.json has it on top)."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text(encoding="utf-8")
    row = next(line for line in doc.splitlines() if line.startswith("| `metrics.json` |"))
    written = json.loads((trained / "eval" / "metrics.json").read_text())
    assert "overall" not in written and "overall" in written["metrics"]
    assert all(f"`{key}`" in row for key in written)  # every top-level key is named
    assert all(f"`{block}`" in row.split("`metrics`: the blocks", 1)[1] for block in written["metrics"])
    assert "overall" in json.loads((trained / "eval" / "step.json").read_text())["metrics"]
    # whether the history was masked follows blend.json's repeats rule: a catalog whose users never repeat is masked
    repeats = json.loads((trained / "sft" / "blend.json").read_text())["repeats"]
    policies = {written["exclude_seen"]: written["seen_masked"],
                written["other_policy"]["exclude_seen"]: written["other_policy"]["seen_masked"]}
    assert policies == {True: True, False: repeats["seen_masked"]} and repeats["seen_masked"] == (repeats["share"] < 0.01)


def test_a_visitor_without_history_gets_what_is_popular_lately_everywhere(trained, catalog, tmp_path):
    """#38: an empty history, or one of unknown ids only, is answered by sft's no-history prior (item_prior.npy),
    flagged as a fallback, the same list from the workdir, a bundle, Recommender and recommend_batch."""
    import numpy as np

    from gencli.core.infer.prior import prior_order
    from gencli.core.infer.recommend import Recommender

    ids, _ = catalog
    counts, prior = np.load(trained / "sft" / "item_prior.npy")
    assert (counts == np.bincount([i for s in pl.read_parquet(trained / "ingest" / "train.parquet")["sequence"]
                                   for i in s[1:]], minlength=len(ids))).all()
    expected = [ids[i] for i in prior_order(prior, counts)[:5]]
    record = json.loads((trained / "sft" / "blend.json").read_text())["prior"]
    assert record["half_life_days"] in [row["half_life_days"] for row in record["valid"]]
    for history in ("", "nope-1,nope-2"):
        answer = _json(_run(trained, "recommend", "--history", history, "--k", "5", "--json"))["recommendations"][0]
        assert [i["item_id"] for i in answer["items"]] == expected and answer["fallback"] is True
        assert answer["history_used"] == 0
        scores = [i["score"] for i in answer["items"]]
        assert scores == pytest.approx(np.log(np.sort(prior)[::-1][:5] / prior.sum()).tolist(), rel=1e-5)
    known = _json(_run(trained, "recommend", "--history", ids[0], "--k", "5", "--json"))["recommendations"][0]
    assert known["fallback"] is False and known["history_used"] == 1
    model = _json(_run(trained, "recommend", "--history", "", "--k", "5", "--ranking", "model", "--json"))
    assert model["recommendations"][0]["fallback"] is False  # the model alone answers with its own list
    out = tmp_path / "shop"
    assert _run(trained, "export", str(out), "--json").exit_code == 0
    assert (out / "item_prior.npy").read_bytes() == (trained / "sft" / "item_prior.npy").read_bytes()
    rec = Recommender.load(out)
    assert [r.item_id for r in rec.recommend([], k=5)] == expected
    with pytest.warns(UserWarning, match="skipped 1 item id"):
        batch = rec.recommend_batch([[], ["nope"], [ids[0]]], k=5)
    assert [r.item_id for r in batch[0]] == [r.item_id for r in batch[1]] == expected
    bundle = _json(_bundle(out, "--history", "", "--k", "5", "--json"))["recommendations"][0]
    assert [i["item_id"] for i in bundle["items"]] == expected and bundle["fallback"] is True


def test_eval_reports_history_lengths_and_the_no_history_answer(trained):
    import numpy as np

    from gencli.core.infer.metrics import popularity_order, rank_of_target

    written = json.loads((trained / "eval" / "metrics.json").read_text())
    test = pl.read_parquet(trained / "ingest" / "test.parquet")
    preds = pl.read_parquet(trained / "eval" / "predictions.parquet")
    lengths = {u: len(h) for u, h in zip(test["user_idx"], test["history"], strict=True)}
    by = written["by_history"]
    assert set(by) == {"gencli", "model_only", "content", "popularity"}
    assert sum(b["users"] for b in by["gencli"].values()) == written["users"]
    for label, block in by["gencli"].items():  # each bucket is the users of that history length
        low, high = {"1": (1, 1), "2-3": (2, 3), "4-9": (4, 9), "10+": (10, 10**9)}[label]
        inside = [u for u in preds["user_idx"].to_list() if low <= lengths[u] <= high]
        rows = preds.filter(pl.col("user_idx").is_in(inside))
        assert block["users"] == rows.height
        assert block["recall@10"] == pytest.approx(float(((rows["rank"] >= 1) & (rows["rank"] <= 10)).mean()))
    counts, prior = np.load(trained / "sft" / "item_prior.npy")
    targets = preds["target"].to_numpy()
    pop = rank_of_target(np.broadcast_to(popularity_order(counts)[:10], (len(targets), 10)), targets)
    assert written["no_history"]["popularity"]["recall@10"] == pytest.approx(float(((pop >= 1) & (pop <= 10)).mean()))
    assert set(written["no_history"]) >= {"gencli", "popularity", "content"}
    shown = _run(trained, "eval", "--beams", "20", "--k", "10", "--max-users", "8", "--force")
    assert shown.exit_code == 0 and "no history: gencli R@10" in shown.output  # the table a person reads says it
