"""Recommender and the export bundle on a tiny saved Qwen3 (no workdir)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
import torch
from helpers.factories import random_codes, tiny_qwen3, write_sid_vocab

from gencli.config import EvalConfig
from gencli.core import artifacts
from gencli.core.infer import bundle, promote
from gencli.core.infer.evaluate import run as run_eval
from gencli.core.infer.recommend import Recommender
from gencli.core.lm.prompt import SidVocab
from gencli.errors import ArtifactError, InputError

LEVELS = (4, 4, 3)
BASE = 30
N_ITEMS = 30

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A saved tiny model, its SID vocab and a 30-item catalog with ids and titles."""
    root = tmp_path_factory.mktemp("rec")
    tiny_qwen3(BASE + sum(LEVELS)).save_pretrained(root / "model")
    vocab = SidVocab(write_sid_vocab(root, LEVELS, BASE), bos_id=1, eos_id=2, pad_id=0, base_vocab_size=BASE)
    codes = random_codes(np.random.default_rng(0), LEVELS, N_ITEMS, 80)
    ids = [f"i{i:03d}" for i in range(N_ITEMS)]
    titles = [f"Title {i}" for i in range(N_ITEMS)]
    return root, vocab, codes, ids, titles


def make(parts, **kw) -> Recommender:
    root, vocab, codes, ids, titles = parts
    model = tiny_qwen3(BASE + sum(LEVELS))  # the same weights as the saved folder (seeded)
    return Recommender(model, vocab, ids, titles, codes, max_history=kw.pop("max_history", 3), **kw)


def test_include_seen_is_exactly_evals_ranking(parts, tmp_path):
    root, vocab, codes, ids, _ = parts
    rng = np.random.default_rng(1)
    histories = [rng.integers(0, N_ITEMS, rng.integers(0, 7)).tolist() for _ in range(9)]
    split = pl.DataFrame({"user_idx": pl.Series(range(9), dtype=pl.Int32),
                          "history": pl.Series(histories, dtype=pl.List(pl.Int32)),
                          "target": pl.Series([0] * 9, dtype=pl.Int32)})
    run_eval(EvalConfig(beams=8, k=(5,), batch_size=4, max_history=3, device="cpu"), model_dir=root / "model",
             vocab=vocab, item_codes=codes, item_ids=ids, split=split, target_buckets=None, cohort_mask=None,
             out_dir=tmp_path)
    expected = np.array(pl.read_parquet(tmp_path / artifacts.PREDICTIONS)["items"].to_list())
    rec = make(parts, batch_size=3)
    ranked = rec.rank(histories, k=5, beams=8, exclude_seen=False)
    assert (ranked.items == expected).all()
    # and through the id API
    lists = rec.recommend_batch([[ids[i] for i in h] for h in histories], k=5, beams=8, exclude_seen=False)
    assert [[r.item_id for r in row] for row in lists] == [[ids[i] for i in row] for row in expected.tolist()]


def test_promotion_scores_the_users_and_the_numbers_eval_gives(parts, tmp_path):
    """run --promote draws its validation users and computes Recall/NDCG as gencli eval does: on the same split,
    seed and number of users, promote.score of the recommender is eval's metrics.json, to the bit."""
    root, vocab, codes, ids, _ = parts
    rng = np.random.default_rng(5)
    n = 14
    histories = [rng.integers(0, N_ITEMS, rng.integers(0, 7)).tolist() for _ in range(n)]
    rec = make(parts, batch_size=3)
    top = rec.rank(histories, k=5, beams=8, exclude_seen=False).items.tolist()
    # even users: a target at rank u % 5 + 1 of their own list; odd users: a random item (mostly a miss)
    targets = [top[u][u % 5] if u % 2 == 0 else int(rng.integers(0, N_ITEMS)) for u in range(n)]
    split = pl.DataFrame({"user_idx": pl.Series(range(n), dtype=pl.Int32),
                          "history": pl.Series(histories, dtype=pl.List(pl.Int32)),
                          "target": pl.Series(targets, dtype=pl.Int32)})
    cfg = EvalConfig(beams=8, k=(5,), batch_size=4, max_history=3, device="cpu", max_users=9, seed=3)
    metrics = run_eval(cfg, model_dir=root / "model", vocab=vocab, item_codes=codes, item_ids=ids, split=split,
                       target_buckets=None, cohort_mask=None, out_dir=tmp_path)["metrics"]["overall"]
    chosen = pl.read_parquet(tmp_path / artifacts.PREDICTIONS)["user_idx"].to_list()
    everyone = promote.ValidationUsers([[ids[i] for i in h] for h in histories], [ids[t] for t in targets])
    users = everyone.sample(9, seed=3)
    assert users.targets == [ids[targets[u]] for u in chosen] and len(chosen) == 9
    assert users.histories == [everyone.histories[u] for u in chosen]
    ranks = [top[u].index(targets[u]) + 1 if targets[u] in top[u] else 0 for u in chosen]
    assert metrics["recall@5"] == pytest.approx(sum(r > 0 for r in ranks) / 9) and 0 < metrics["recall@5"] < 1
    assert metrics["ndcg@5"] == pytest.approx(sum(1 / math.log2(r + 1) for r in ranks if r) / 9)
    assert promote.score(rec, users, k=5, beams=8) == {**metrics, "unknown_targets": 0}
    # a target the bundle does not know (a new item) is a miss, and is counted
    grown = promote.ValidationUsers([*users.histories, []], [*users.targets, "new-item"])
    scored = promote.score(rec, grown, k=5, beams=8)
    assert scored["users"] == 10 and scored["unknown_targets"] == 1
    assert scored["recall@5"] == pytest.approx(metrics["recall@5"] * 9 / 10)
    assert everyone.sample(0, seed=3) == everyone == everyone.sample(n, seed=3)


def test_exclude_seen_gives_k_distinct_unseen_items_even_when_most_are_seen(parts):
    rec = make(parts)
    rng = np.random.default_rng(2)
    everything = list(range(N_ITEMS))
    histories = [
        [],
        rng.choice(N_ITEMS, 5, replace=False).tolist(),
        rng.permutation(N_ITEMS)[: N_ITEMS - 10].tolist(),  # exactly k unseen items left
        rng.permutation(N_ITEMS)[: N_ITEMS - 11].tolist() * 2,  # repeats in a history are fine
        rng.permutation(N_ITEMS)[: N_ITEMS - 4].tolist(),  # fewer than k left: all of them, then nothing
        everything,
    ]
    ranked = rec.rank(histories, k=10, beams=10)  # beams == k: the masking must not starve the beam
    for h, row, scores in zip(histories, ranked.items.tolist(), ranked.scores, strict=True):
        left = N_ITEMS - len(set(h))
        got = [i for i in row if i >= 0]
        assert len(got) == min(10, left) == len(set(got))
        assert not set(got) & set(h)
        assert np.isfinite(scores[: len(got)]).all() and np.isneginf(scores[len(got):]).all()
    # the unmasked list of the first user is what a seen-nothing user gets
    assert ranked.items[0].tolist() == rec.rank([[]], k=10, beams=10, exclude_seen=False).items[0].tolist()


def test_id_api_unknown_ids_strict_and_types(parts):
    rec = make(parts)
    with pytest.warns(UserWarning, match="skipped 1 item id.*nope"):
        with_unknown = rec.recommend(["i001", "nope", "i002"], k=4)
    assert with_unknown == rec.recommend(["i001", "i002"], k=4)
    assert all(isinstance(r.score, float) and r.title.startswith("Title") for r in with_unknown)
    item_id, score, title = with_unknown[0]  # a plain tuple
    assert title == f"Title {int(item_id[1:])}"
    assert {r.item_id for r in with_unknown}.isdisjoint({"i001", "i002"})
    with pytest.raises(InputError, match="not in the catalog: nope"):
        rec.recommend(["i001", "nope"], strict=True)
    with pytest.raises(TypeError, match="not a string"):
        rec.recommend("i001")
    with pytest.raises(InputError, match="must be >= --k"):
        rec.recommend(["i001"], k=5, beams=3)
    assert len(rec.recommend([], k=25)) == 25  # empty history: the unconditional top K (beams grow to k)


def test_bundle_round_trips_in_a_fresh_process(parts, tmp_path):
    root, vocab, codes, ids, titles = parts
    out = tmp_path / "bundle"
    meta = {"source": {"model_step": "sft", "steps": {}}, "metrics": {}, "decode": {"max_history": 3, "beams": 20}}
    bundle.write_bundle(out, root / "model", root / artifacts.SID_VOCAB, ids, titles, codes, meta)
    assert sorted(p.name for p in out.iterdir()) == ["gencli.json", "items.parquet", "model", "sid_vocab.json"]
    assert not list(tmp_path.glob(".bundle*"))  # the staging folder is gone
    histories = [["i003", "i007"], [], ["i010", "i011", "i012", "i013"]]
    expected = [[list(r) for r in row] for row in make(parts).recommend_batch(histories, k=6)]
    code = ("import json, sys; from gencli import Recommender; rec = Recommender.load(sys.argv[1]); "
            "print(json.dumps([[list(r) for r in row] for row in rec.recommend_batch(json.loads(sys.argv[2]), k=6)]))")
    done = subprocess.run([sys.executable, "-c", code, str(out), json.dumps(histories)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env={**_env(), "GENCLI_WORKDIR": str(tmp_path / "none")})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected
    with pytest.raises(InputError, match="not empty; choose a new folder or pass --force"):
        bundle.write_bundle(out, root / "model", root / artifacts.SID_VOCAB, ids, titles, codes, meta)


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k != "GENCLI_WORKDIR"} | {"OMP_NUM_THREADS": "1"}


@pytest.fixture
def good_bundle(parts, tmp_path):
    root, _, codes, ids, titles = parts
    out = tmp_path / "b"
    meta = {"source": {}, "metrics": {}, "decode": {"max_history": 3}}
    bundle.write_bundle(out, root / "model", root / artifacts.SID_VOCAB, ids, titles, codes, meta)
    return out


def _edit_json(folder, **changes):
    """Change gencli.json's fields and its checksum with them (what these tests check lies past the checksum)."""
    from gencli.core.infer.bundle_check import CHECKSUM, manifest_digest

    meta = json.loads((folder / bundle.BUNDLE_JSON).read_text())
    meta.update(changes)
    meta[CHECKSUM] = manifest_digest(meta)
    (folder / bundle.BUNDLE_JSON).write_text(json.dumps(meta))


def test_bundle_errors_name_the_problem(good_bundle, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        Recommender.load(tmp_path / "missing")
    with pytest.raises(InputError, match="not a gencli bundle"):
        Recommender.load(tmp_path)
    newer = tmp_path / "newer"
    shutil.copytree(good_bundle, newer)
    _edit_json(newer, format_version=bundle.FORMAT_VERSION + 1, gencli_version="9.0")
    with pytest.raises(InputError, match=r"format_version 2, written by gencli 9.0.*upgrade gencli"):
        Recommender.load(newer)
    _edit_json(newer, format_version="one")
    with pytest.raises(ArtifactError, match="unknown format_version 'one'"):
        Recommender.load(newer)
    truncated = tmp_path / "truncated"
    shutil.copytree(good_bundle, truncated)
    data = (truncated / "items.parquet").read_bytes()
    (truncated / "items.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=r"items.parquet has \d+ bytes, \d+ expected; re-export"):
        Recommender.load(truncated)
    garbled = tmp_path / "garbled"
    shutil.copytree(good_bundle, garbled)
    (garbled / "items.parquet").write_bytes(b"x" * len(data))
    with pytest.raises(ArtifactError, match="items.parquet differs from what was exported"):
        Recommender.load(garbled)
    _edit_json(garbled, sha256={})  # a bundle of an earlier version: no digests, the reader still catches it
    with pytest.raises(ArtifactError, match="items.parquet is corrupt"):
        Recommender.load(garbled)
    flipped = tmp_path / "flipped"
    shutil.copytree(good_bundle, flipped)
    weights = bytearray((flipped / "model" / "model.safetensors").read_bytes())
    weights[-7] ^= 0x10  # one bit in the last tensor's data, same size
    (flipped / "model" / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(ArtifactError, match="model/model.safetensors differs from what was exported"):
        Recommender.load(flipped)
    no_model = tmp_path / "no_model"
    shutil.copytree(good_bundle, no_model)
    shutil.rmtree(no_model / "model")
    with pytest.raises(ArtifactError, match="model/config.json is missing"):
        Recommender.load(no_model)
    (good_bundle / bundle.BUNDLE_JSON).write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        Recommender.load(good_bundle)


def test_k_and_beams_are_capped_by_the_catalog_not_grown_without_bound(parts):
    """k = 10**9 once set beams = k and grew to 22.8 GB: lists are capped at the catalog's size instead."""
    rec = make(parts)
    everything = rec.recommend([], k=10**9)
    assert len(everything) == N_ITEMS and len({r.item_id for r in everything}) == N_ITEMS
    assert [r.item_id for r in everything[:10]] == [r.item_id for r in rec.recommend([], k=10)]
    unseen = rec.recommend(["i001", "i002"], k=10**9, beams=10**12)
    assert len(unseen) == N_ITEMS - 2 and not {"i001", "i002"} & {r.item_id for r in unseen}
    ranked = rec.rank([[1], [2, 3]], k=10**9)
    assert ranked.items.shape == (2, N_ITEMS)


def test_force_replaces_a_bundle_but_never_a_folder_holding_anything_else(parts, tmp_path):
    """`export P --force` where P held the workdir deleted it: only a bundle's own listed files may be replaced."""
    root, _, codes, ids, titles = parts
    meta = {"source": {}, "metrics": {}, "decode": {"max_history": 3}}

    def write(out):
        return bundle.write_bundle(out, root / "model", root / artifacts.SID_VOCAB, ids, titles, codes, meta,
                                   force=True)

    parent = tmp_path / "p"
    (parent / "ws" / "ingest").mkdir(parents=True)
    (parent / "ws" / "manifest.json").write_text("{}")
    (parent / "notes.txt").write_text("x")
    with pytest.raises(InputError, match=r"replaces only a gencli bundle.*(notes.txt|ws/manifest.json).*nothing was"):
        write(parent)
    assert (parent / "notes.txt").read_text() == "x" and (parent / "ws" / "manifest.json").exists()
    out = tmp_path / "b"
    write(out)
    write(out)  # a bundle is replaced by a bundle
    assert Recommender.load(out).recommend(["i001"], k=3)
    (out / "model" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"holds other files \(model/notes.txt\)"):
        write(out)
    assert (out / "model" / "notes.txt").exists() and (out / bundle.BUNDLE_JSON).exists()
    with pytest.raises(InputError, match="holds the model being exported"):
        bundle.write_bundle(root, root / "model", root / artifacts.SID_VOCAB, ids, titles, codes, meta, force=True)
    assert (root / "model" / "config.json").exists()


@pytest.mark.parametrize("decode", [{"max_history": "abc"}, {"max_history": 3, "beams": [1]},
                                    {"max_history": 3, "beams": 10**12}, {"max_history": 0}, "fast"])
def test_bundle_decode_fields_of_the_wrong_type_or_size_are_refused(good_bundle, decode):
    _edit_json(good_bundle, decode=decode)
    with pytest.raises(ArtifactError, match=r"(field decode\.(max_history|beams) must be|lacks the 'decode').*re-export"):
        Recommender.load(good_bundle)


def test_import_gencli_stays_light():
    code = "import sys, gencli; assert gencli.__version__; print(sorted(m for m in ('torch', 'polars') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert torch  # the test module itself may import torch; the check above runs in a fresh process


def test_bundle_paths_are_confined_to_the_bundle(good_bundle, tmp_path):
    """A weight_map naming ../outside.safetensors was followed; a file list naming /etc/shadow was stat-ed."""
    meta = json.loads((good_bundle / bundle.BUNDLE_JSON).read_text())
    for name in ("/etc/shadow", "../outside.txt", "model/../../x"):
        _edit_json(good_bundle, files={**meta["files"], name: 1})
        with pytest.raises(ArtifactError, match="lists file\\(s\\) outside the bundle") as err:
            Recommender.load(good_bundle)
        assert "missing" not in str(err.value) and "bytes" not in str(err.value)  # says nothing of the file
    _edit_json(good_bundle, files={**meta["files"], "items.parquet": "big"})
    with pytest.raises(ArtifactError, match="items.parquet has no byte count"):
        Recommender.load(good_bundle)
    _edit_json(good_bundle, files=meta["files"])
    (tmp_path / "outside.safetensors").write_bytes(b"x")
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "../../outside.safetensors"}}
    index_file = good_bundle / "model" / "model.safetensors.index.json"
    index_file.write_text(json.dumps(index))
    with pytest.raises(ArtifactError, match="model.safetensors.index.json is not listed in gencli.json"):
        Recommender.load(good_bundle)
    name = "model/model.safetensors.index.json"  # listed and signed: its weight_map is still confined
    _edit_json(good_bundle, files={**meta["files"], name: index_file.stat().st_size},
               sha256={**meta["sha256"], name: hashlib.sha256(index_file.read_bytes()).hexdigest()})
    with pytest.raises(ArtifactError, match="points to weights outside the bundle"):
        Recommender.load(good_bundle)


def test_a_broken_model_is_an_error_never_an_empty_answer(parts):
    """NaN weights and items sharing one SID gave `{"items": []}` with exit 0."""
    from gencli.errors import BrokenModelError

    root, vocab, codes, ids, titles = parts
    model = tiny_qwen3(BASE + sum(LEVELS))
    with torch.no_grad():
        model.get_output_embeddings().weight.fill_(float("nan"))
    rec = Recommender(model, vocab, ids, titles, codes, max_history=3)
    with pytest.raises(BrokenModelError, match="the model is broken"):
        rec.recommend(["i001"], k=5)
    same = np.repeat(codes[:1], N_ITEMS, axis=0)
    with pytest.raises(ArtifactError, match="29 item\\(s\\) share their SID"):
        Recommender(tiny_qwen3(BASE + sum(LEVELS)), vocab, ids, titles, same)
    far = SidVocab(vocab.token_ids, bos_id=10**9, eos_id=2, pad_id=0, base_vocab_size=BASE)
    with pytest.raises(ArtifactError, match="bos_id 1000000000 is not a token of the model"):
        Recommender(tiny_qwen3(BASE + sum(LEVELS)), far, ids, titles, codes)


def test_a_pointer_file_that_is_not_utf8_is_bad_input(tmp_path):
    pointer = tmp_path / "current"
    pointer.write_bytes(b"\xff\xfe/srv/bundle\n")
    with pytest.raises(InputError, match="pointer file .*current cannot be read as one UTF-8 bundle path"):
        Recommender.load(pointer)


def test_one_recommender_is_safe_to_share_between_threads(parts):
    """README: a Recommender may be called from several threads (nothing in it changes during a call): every
    thread gets exactly the sequential answer. It is not faster that way; recommend_batch is."""
    from concurrent.futures import ThreadPoolExecutor

    rec = make(parts)
    rng = np.random.default_rng(3)
    histories = [[f"i{i:03d}" for i in rng.integers(0, N_ITEMS, rng.integers(0, 6))] for _ in range(24)]
    alone = [rec.recommend(h, k=5) for h in histories]
    with ThreadPoolExecutor(4) as pool:
        shared = list(pool.map(lambda h: rec.recommend(h, k=5), histories))
    assert [[r.item_id for r in x] for x in shared] == [[r.item_id for r in x] for x in alone]
    assert [r.score for x in shared for r in x] == pytest.approx([r.score for x in alone for r in x], abs=1e-5)
