"""blend.json (core/infer/blendfile.py): one record writes and reads it, the same bytes for the same record, and a
file that is not a blend file is refused naming the file and the field."""

from __future__ import annotations

import json

import pytest

from gencli.core import artifacts
from gencli.core.infer.blendfile import BlendFile
from gencli.core.infer.content import MODEL_ONLY, Blend

BLENDS = {"exclude_seen": Blend(0.7, 0.1, 2.0, cold=2.0), "include_seen": MODEL_ONLY}
FIT = {"users": 8, "valid": {"blend": {"recall@10": 0.5, "ndcg@10": 0.25, "cold_recall@10": 0.2,
                                       "cold_ndcg@10": 0.1}}}


def test_a_record_round_trips_byte_for_byte(tmp_path):
    record = BlendFile(BLENDS, {"exclude_seen": {"1": Blend(0.5)}, "include_seen": {}}, FIT, {"half_life_days": 7})
    record.write(tmp_path)
    text = (tmp_path / artifacts.BLEND).read_text(encoding="utf-8")
    assert list(json.loads(text)) == ["blends", "by_history", "fit", "prior"]
    again = BlendFile.read(tmp_path / artifacts.BLEND)
    assert again == record and again.to_json() == text
    assert again.users == 8 and again.score() == 0.75 and again.score(cold=True) == pytest.approx(0.3)
    assert again.score("include_seen") is None  # the file holds no score for it


def test_the_text_mix_and_the_repeats_record_round_trip_and_default_when_absent(tmp_path):
    text = {"dense_share": 0.3, "users": 8, "objective": "recall@10 + ndcg@10", "policy": "exclude_seen", "grid": []}
    repeats = {"share": 0.004, "floor": 0.01, "seen_masked": True}
    record = BlendFile(BLENDS, None, FIT, None, text, repeats)
    record.write(tmp_path)
    again = BlendFile.read(tmp_path / artifacts.BLEND)
    assert again == record and again.dense_share == 0.3 and again.repeat_share == 0.004
    plain = BlendFile(BLENDS)
    assert plain.dense_share == 1.0 and plain.repeat_share is None  # a file from before: dense alone, seen ranked


def test_a_file_without_fit_or_history_blends_reads_as_a_bundle_made_by_hand(tmp_path):
    path = tmp_path / artifacts.BLEND
    path.write_text(json.dumps({"blends": {p: b.to_dict() for p, b in BLENDS.items()}}), encoding="utf-8")
    record = BlendFile.read(path)
    assert record.blends == BLENDS and record.by_history is None and record.fit is None and record.users is None


@pytest.mark.parametrize("record, field", [
    ([1, 2], "must be a JSON object"),
    ({"blends": {"exclude_seen": {"weight": 0.5}}}, "blends must hold one blend per policy"),
    ({"blends": {"exclude_seen": {"weight": 2}, "include_seen": {"weight": 1}}}, "blends: blend weight"),
    ({"blends": {p: {"weight": 1} for p in BLENDS}, "by_history": {"x": {}}}, "by_history must map"),
    ({"blends": {p: {"weight": 1} for p in BLENDS}, "fit": {"valid": {}}}, "fit.valid.blend must be an object"),
    ({"blends": {p: {"weight": 1} for p in BLENDS}, "prior": 3}, "prior must be an object"),
    ({"blends": {p: {"weight": 1} for p in BLENDS}, "text": {"dense_share": 1.5}}, r"text.dense_share must be"),
    ({"blends": {p: {"weight": 1} for p in BLENDS}, "text": 0.5}, r"text.dense_share must be"),
    ({"blends": {p: {"weight": 1} for p in BLENDS}, "repeats": {"share": "x"}}, r"repeats.share must be"),
    ({"blends": {p: {"weight": 1} for p in BLENDS}, "repeats": {"share": True}}, r"repeats.share must be"),
])
def test_a_damaged_record_is_refused_naming_the_file_and_the_field(tmp_path, record, field):
    path = tmp_path / artifacts.BLEND
    path.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(ValueError, match=field) as caught:
        BlendFile.read(path)
    assert str(caught.value).startswith(str(path))
