"""eval / cold-eval core on a tiny saved Qwen3 folder."""

import json

import numpy as np
import polars as pl
import pytest
from helpers.factories import tiny_qwen3
from transformers import Qwen3ForCausalLM

from gencli.config import EvalConfig
from gencli.core import artifacts
from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.evaluate import run
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.prompt import SidVocab, build_prompt, item_token_ids
from gencli.errors import ArtifactError, InputError

LEVELS = (4, 4, 3)  # 2 levels + dedup
BASE = 30


IDS = [f"item-{i:03d}" for i in range(30)]  # the catalog's item ids, aligned with item_idx


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    tiny_qwen3(BASE + sum(LEVELS)).save_pretrained(root / "model")
    offsets = np.cumsum([BASE, *LEVELS[:-1]])
    vocab = SidVocab(
        [list(range(o, o + k)) for o, k in zip(offsets, LEVELS, strict=True)],
        bos_id=1,
        eos_id=2,
        pad_id=0,
        base_vocab_size=BASE,
    )
    rng = np.random.default_rng(0)
    codes = np.unique(np.stack([rng.integers(0, k, 60) for k in LEVELS], axis=1), axis=0)[:30]
    n_users = 12
    split = pl.DataFrame(
        {
            "user_idx": pl.Series(np.arange(n_users) * 10, dtype=pl.Int32),
            "history": pl.Series(
                [rng.integers(0, 30, rng.integers(0, 6)).tolist() for _ in range(n_users)], dtype=pl.List(pl.Int32)
            ),
            "target": pl.Series(rng.integers(0, 30, n_users), dtype=pl.Int32),
        }
    )
    buckets = np.array(["head"] * 10 + ["torso"] * 10 + ["tail"] * 10)
    return root, vocab, codes, split, buckets


def test_eval_writes_predictions_and_metrics(setup, tmp_path):
    root, vocab, codes, split, buckets = setup
    cfg = EvalConfig(beams=6, k=(1, 5), batch_size=5, max_history=3, device="cpu")
    result = run(cfg, root / "model", vocab, codes, IDS, split, buckets, None, tmp_path)
    preds = pl.read_parquet(tmp_path / artifacts.PREDICTIONS)
    assert preds.schema == pl.Schema(
        {
            "user_idx": pl.Int32,
            "target": pl.Int32,
            "target_id": pl.String,
            "items": pl.List(pl.Int64),
            "item_ids": pl.List(pl.String),
            "scores": pl.List(pl.Float32),
            "rank": pl.Int32,
        }
    )
    assert preds["user_idx"].to_list() == split["user_idx"].to_list()
    items = np.array(preds["items"].to_list())
    # item ids next to the indices: IDS[i] for every predicted item and for the target
    assert preds["item_ids"].to_list() == [[IDS[i] for i in row] for row in items.tolist()]
    assert preds["target_id"].to_list() == [IDS[t] for t in split["target"].to_list()]
    assert items.shape == (12, 5)
    # the same as decoding the prompt format by hand
    tokens = item_token_ids(codes, vocab)
    model = Qwen3ForCausalLM.from_pretrained(root / "model")
    prompts = [build_prompt(h, tokens, 3, 1) for h in split["history"].to_list()]
    expected, _ = constrained_beam_search(model, prompts, SidTrie(tokens), beams=6, top_k=5, batch_size=5)
    assert (items == expected).all()
    targets = split["target"].to_numpy()
    ranks = [row.index(t) + 1 if t in row else 0 for row, t in zip(items.tolist(), targets, strict=True)]
    assert preds["rank"].to_list() == ranks
    metrics = json.loads((tmp_path / artifacts.METRICS_JSON).read_text())
    assert metrics["users"] == 12 and metrics["cohort_size"] is None and metrics["beams"] == 6
    overall = metrics["metrics"]["overall"]
    assert overall["recall@5"] == pytest.approx(np.mean([0 < r <= 5 for r in ranks]))
    assert overall["users"] == 12
    per_bucket = {b: int(np.sum(buckets[targets] == b)) for b in ("head", "torso", "tail")}
    assert {b: metrics["metrics"][b]["users"] for b in per_bucket if per_bucket[b]} == {
        b: n for b, n in per_bucket.items() if n
    }
    assert result["metrics"] == metrics["metrics"] and result["users_per_s"] > 0


def test_cohort_subsample_and_determinism(setup, tmp_path):
    root, vocab, codes, split, _ = setup
    cfg = EvalConfig(beams=4, k=(2,), max_users=3, seed=7, device="cpu", cold_max_train_count=1)
    cohort = np.arange(12) % 2 == 0
    first = run(cfg, root / "model", vocab, codes, IDS, split, None, cohort, tmp_path / "a")
    run(cfg, root / "model", vocab, codes, IDS, split, None, cohort, tmp_path / "b")
    assert first["cohort_size"] == 6 and first["users"] == 3
    users = pl.read_parquet(tmp_path / "a" / artifacts.PREDICTIONS)["user_idx"].to_list()
    assert len(users) == 3 and set(users) <= {0, 20, 40, 60, 80, 100} and users == sorted(users)
    for name in (artifacts.PREDICTIONS, artifacts.METRICS_JSON):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_empty_cohort_suggests_larger_max_train_count(setup, tmp_path):
    root, vocab, codes, split, _ = setup
    cfg = EvalConfig(beams=4, k=(2,), device="cpu", cold_max_train_count=0)
    with pytest.raises(InputError, match="cohort is empty.*larger --max-train-count"):
        run(cfg, root / "model", vocab, codes, IDS, split, None, np.zeros(12, dtype=bool), tmp_path)


def test_bad_inputs_name_the_problem(setup, tmp_path):
    root, vocab, codes, split, _ = setup
    cfg = EvalConfig(beams=4, k=(2,), device="cpu")
    bad = split.with_columns(pl.when(pl.col("user_idx") == 30).then(99).otherwise(pl.col("target")).alias("target"))
    with pytest.raises(ArtifactError, match=r"test.parquet rows \[3\] refer to items outside"):
        run(cfg, root / "model", vocab, codes, IDS, bad, None, None, tmp_path)
    with pytest.raises(ArtifactError, match="lacks column"):
        run(cfg, root / "model", vocab, codes, IDS, split.drop("history"), None, None, tmp_path)
    with pytest.raises(ArtifactError, match="has no config.json"):
        run(cfg, tmp_path / "nothing", vocab, codes, IDS, split, None, None, tmp_path)
    no_bos = SidVocab(vocab.token_ids, None, 2, 0, BASE)
    with pytest.raises(InputError, match="user_idx \\d+: a user has an empty history"):
        run(cfg, root / "model", no_bos, codes, IDS, split, None, None, tmp_path)
