"""bench/common.py's ml100k-new construction on a hand-built RecBole log whose outcome is known (no download)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

BENCH = Path(__file__).resolve().parents[2] / "bench"

# items 1-4 are first rated early, 5 and 6 last (share 1/3 of 6 items: 2 new items)
LOG = [  # user, item, rating, time
    ("a", 1, 4, 10), ("a", 2, 4, 11), ("a", 5, 4, 50), ("a", 3, 4, 51), ("a", 6, 4, 52), ("a", 4, 4, 53),
    ("b", 2, 3, 12), ("b", 3, 3, 13), ("b", 1, 3, 14), ("b", 6, 3, 60), ("b", 4, 3, 61),
    ("c", 3, 5, 15), ("c", 4, 5, 16), ("c", 1, 5, 17),
]


def test_new_items_are_cut_to_at_most_two_per_user_and_nothing_after(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import common

    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    source = tmp_path / "ml"
    source.mkdir()
    lines = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    lines += [f"{u}\t{i}\t{r}\t{t}" for u, i, r, t in LOG]
    (source / "ml-100k.inter").write_text("\n".join(lines) + "\n")
    (source / "ml-100k.item").write_text("item_id:token\tmovie_title:token_seq\n" + "".join(
        f"{i}\tmovie {i}\n" for i in range(1, 7)))
    out = common.ml100k_new_folder(share=1 / 3, source=source)
    kept = pl.read_csv(out / "ml-100k.inter", separator="\t", infer_schema_length=0)
    by_user = {u: g.sort(kept.columns[3])[kept.columns[1]].to_list()
               for (u,), g in kept.group_by(kept.columns[0])}
    # a: before the first new item, then new items 5 and 6 (3 between them and 4 after are dropped)
    assert by_user == {"a": ["1", "2", "5", "6"], "b": ["2", "3", "1", "6"], "c": ["3", "4", "1"]}
    assert (out / "ml-100k.item").read_bytes() == (source / "ml-100k.item").read_bytes()
    assert common.ml100k_new_folder(share=1 / 3, source=source) == out  # built once
