"""The prompt format: pure SID tokens, [bos] + last N history SIDs, target SID labelled."""

import json

import numpy as np
import pytest

from gencli.core.lm.loss import IGNORE_INDEX
from gencli.core.lm.prompt import SidVocab, build_example, build_prompt, item_token_ids, load_sid_vocab
from gencli.errors import ArtifactError, InputError

VOCAB = SidVocab(token_ids=[[10, 11, 12], [13, 14], [15, 16]], bos_id=1, eos_id=2, pad_id=0, base_vocab_size=10)
CODES = np.array([[0, 0, 0], [2, 1, 0], [1, 0, 1]])


def test_load_sid_vocab_roundtrip(tmp_path):
    path = tmp_path / "sid_vocab.json"
    path.write_text(
        json.dumps({"token_ids": VOCAB.token_ids, "bos_id": 1, "eos_id": None, "pad_id": 0, "base_vocab_size": 10})
    )
    vocab = load_sid_vocab(path)
    assert vocab.token_ids == VOCAB.token_ids
    assert (vocab.bos_id, vocab.eos_id, vocab.pad_id, vocab.base_vocab_size) == (1, None, 0, 10)
    assert vocab.depth == 3


def test_load_sid_vocab_errors_name_the_file(tmp_path):
    path = tmp_path / "sid_vocab.json"
    with pytest.raises(ArtifactError, match="sid_vocab.json is missing"):
        load_sid_vocab(path)
    path.write_text("{not json")
    with pytest.raises(ArtifactError, match="sid_vocab.json is not valid JSON"):
        load_sid_vocab(path)
    path.write_text(json.dumps({"token_ids": [], "bos_id": "x", "pad_id": 0}))
    with pytest.raises(ArtifactError) as err:
        load_sid_vocab(path)
    message = str(err.value)
    assert "sid_vocab.json is malformed" in message
    assert "'token_ids'" in message and "'bos_id'" in message and "'base_vocab_size'" in message
    assert "'eos_id'" in message  # absent is not the same as null


def test_item_token_ids_maps_each_level():
    tokens = item_token_ids(CODES, VOCAB)
    assert tokens.dtype == np.int64
    assert tokens.tolist() == [[10, 13, 15], [12, 14, 15], [11, 13, 16]]


def test_item_token_ids_rejects_bad_codes():
    with pytest.raises(ArtifactError, match="level 1 must be in \\[0, 2\\) but items \\[1\\]"):
        item_token_ids(np.array([[0, 0, 0], [0, 2, 0]]), VOCAB)
    with pytest.raises(ArtifactError, match="3 levels"):
        item_token_ids(np.array([[0, 0]]), VOCAB)


def test_build_prompt_last_items_oldest_first():
    tokens = item_token_ids(CODES, VOCAB)
    assert build_prompt([0, 1, 2], tokens, max_history=2, bos_id=1) == [1, 12, 14, 15, 11, 13, 16]
    assert build_prompt([2, 0], tokens, max_history=20, bos_id=None) == [11, 13, 16, 10, 13, 15]
    assert build_prompt([], tokens, max_history=5, bos_id=1) == [1]


def test_build_prompt_empty_history_without_bos_is_an_input_error():
    tokens = item_token_ids(CODES, VOCAB)
    with pytest.raises(InputError, match="empty history and the model has no BOS token"):
        build_prompt([], tokens, max_history=5, bos_id=None)


def test_build_example_labels_only_the_target():
    tokens = item_token_ids(CODES, VOCAB)
    input_ids, labels = build_example([0, 1], 2, tokens, max_history=1, bos_id=1)
    assert input_ids == [1, 12, 14, 15, 11, 13, 16]
    assert labels == [IGNORE_INDEX] * 4 + [11, 13, 16]
