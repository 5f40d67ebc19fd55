"""A bundle's model is what its files say: config.json checked by type and range, the weights' safetensors headers
equal to the tensors the config implies, the implied size bounded, all before any weight is read. Each bundle here
is re-signed after the edit (files, sha256 and manifest_sha256 recomputed, as anyone can), so only the model check
can catch it."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from helpers.factories import tiny_bundle, tiny_qwen3
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from gencli.cli import cli
from gencli.core.infer import bundle
from gencli.core.infer.bundle_check import CHECKSUM, manifest_digest
from gencli.core.infer.model_check import MAX_PARAMS, model_problems, parameter_count, structure
from gencli.core.infer.recommend import Recommender
from gencli.errors import ArtifactError

pytestmark = pytest.mark.usefixtures("one_thread")
CONFIG = "model/config.json"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return tiny_bundle(tmp_path_factory.mktemp("model-checked"))


@pytest.fixture
def b(made, tmp_path):
    shutil.copytree(made, tmp_path / "b")
    return tmp_path / "b"


def resign(folder, *names: str) -> None:
    """List ``names`` in gencli.json again at their current size and sha256, and re-sign gencli.json."""
    meta = json.loads((folder / bundle.BUNDLE_JSON).read_text())
    for name in names:
        meta["files"][name] = (folder / name).stat().st_size
        meta["sha256"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    meta[CHECKSUM] = manifest_digest(meta)
    (folder / bundle.BUNDLE_JSON).write_text(json.dumps(meta, indent=2))


def edit_config(folder, **fields) -> None:
    config = json.loads((folder / CONFIG).read_text())
    config.update(fields)
    (folder / CONFIG).write_text(json.dumps(config))
    resign(folder, CONFIG)


def refused_by_recommend(folder, *names: str) -> str:
    """``recommend --bundle`` exits 2 with one message naming ``names``, no traceback."""
    r = CliRunner().invoke(cli, ["recommend", "--bundle", str(folder), "--history", "i001", "--json"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit), r.output
    error = json.loads(r.stdout.strip().splitlines()[-1])["error"]
    for name in names:
        assert name in error, error
    return error


def test_the_exported_bundle_passes_and_answers(b):
    assert model_problems(b / "model") == []
    assert len(Recommender.load(b).recommend(["i001"], k=3)) == 3


@pytest.mark.parametrize(("fields", "says"), [
    ({"num_hidden_layers": 6}, "lack 44 tensor(s)"),  # 4 more layers of 11 tensors each: they would be random
    ({"num_hidden_layers": 3000}, "num_hidden_layers must be an integer in [1, 1,024]"),
    ({"tie_word_embeddings": True}, "tensor(s) config.json does not imply (lm_head.weight)"),
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "does not imply (model.layers.0.self_attn.k_norm"),
    ({"model_type": "gpt2"}, "model_type must be one of qwen3, qwen2, llama"),
    ({"architectures": ["LlamaForCausalLM"]}, "architectures must be [\"Qwen3ForCausalLM\"]"),
    ({"vocab_size": 10**12}, "vocab_size must be an integer in [1, 4,194,304]"),
    ({"vocab_size": 40}, "vocab_size (40) has no row for token id 40"),
    ({"hidden_size": 2**40}, "hidden_size must be an integer"),
    ({"head_dim": 10**9}, "head_dim must be an integer"),
    ({"head_dim": 4096}, "tensor shapes differ"),
    ({"intermediate_size": 1 << 20, "hidden_size": 1 << 16, "num_hidden_layers": 1024}, "more than gencli loads"),
    ({"num_attention_heads": 3}, "must be a multiple of num_key_value_heads"),
    ({"num_hidden_layers": "2"}, "num_hidden_layers must be an integer"),
    ({"tie_word_embeddings": None}, "tie_word_embeddings must be true or false"),
    ({"rms_norm_eps": 1e308}, "rms_norm_eps must be a number in (0, 1)"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_parameters.rope_theta must be a positive"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": float("nan")}}, "rope_parameters.rope_theta must be"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1e4}}, "rope_parameters.rope_theta must be"),
    ({"rope_parameters": "fast"}, "rope_parameters must be an object"),
])
def test_a_config_that_is_not_the_weights_is_refused_before_loading(b, fields, says):
    edit_config(b, **fields)
    assert refused_by_recommend(b, "model/", says).count("re-export") == 1
    with pytest.raises(ArtifactError, match="re-export it"):
        Recommender.load(b)


def test_a_weight_file_without_tensors_is_refused_naming_what_it_lacks(b):
    save_file({}, str(b / "model" / "model.safetensors"))
    resign(b, "model/model.safetensors")
    refused_by_recommend(b, "the weights lack 25 tensor(s)", "model.embed_tokens.weight")


def test_an_extra_tensor_or_one_of_another_shape_or_type_is_named(b):
    from safetensors.torch import load_file

    weights = load_file(str(b / "model" / "model.safetensors"))
    weights["model.layers.0.mlp.extra.weight"] = torch.zeros(2, 2)
    weights["model.norm.weight"] = torch.ones(33)
    weights["lm_head.weight"] = weights["lm_head.weight"].to(torch.int32)
    save_file(weights, str(b / "model" / "model.safetensors"))
    resign(b, "model/model.safetensors")
    refused_by_recommend(b, "model.layers.0.mlp.extra.weight", "model.norm.weight [33] (config: [32])")
    del weights["model.layers.0.mlp.extra.weight"], weights["model.norm.weight"]
    save_file({**weights, "model.norm.weight": torch.ones(32)}, str(b / "model" / "model.safetensors"))
    resign(b, "model/model.safetensors")
    refused_by_recommend(b, "tensors of type I32")


def test_a_tied_model_whose_config_says_untied_lacks_its_head(tmp_path):
    config = Qwen3Config(vocab_size=41, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=64, tie_word_embeddings=True)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    assert model_problems(tmp_path) == []
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "tie_word_embeddings": False}))
    assert model_problems(tmp_path) == ["the weights lack 1 tensor(s) config.json implies (lm_head.weight): they "
                                        "would be random"]


def test_the_parameter_count_is_the_models_own():
    model = tiny_qwen3(41)
    raw = {**model.config.to_dict(), "tie_word_embeddings": False}
    assert parameter_count(structure(raw)) == sum(p.numel() for p in model.parameters()) == 21_248
    assert MAX_PARAMS == 8_000_000_000


def test_a_tokenizer_with_ids_past_vocab_size_is_refused(b):
    tokenizer = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 99}}, "added_tokens": [{"id": 120}]}
    (b / "model" / "tokenizer.json").write_text(json.dumps(tokenizer))
    resign(b, "model/tokenizer.json")
    refused_by_recommend(b, "vocab_size (41) has no row for token id 120")


def test_serve_refuses_a_huge_config_at_start_with_exit_2(b):
    edit_config(b, hidden_size=2**40, intermediate_size=2**40)
    r = CliRunner().invoke(cli, ["serve", "--bundle", str(b), "--port", "0", "--device", "cpu"])
    assert r.exit_code == 2 and "hidden_size must be an integer in [1, 65,536]" in r.output
    assert "Traceback" not in r.output and "MemoryError" not in r.output


def test_a_workdirs_model_goes_through_the_same_check(trained_small, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    config = wd / "sft" / "model" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_hidden_layers": 6}))
    r = CliRunner().invoke(cli, ["recommend", "--workdir", str(wd), "--history", "", "--json"])
    assert r.exit_code == 2, r.output
    error = json.loads(r.stdout.strip().splitlines()[-1])["error"]
    assert "config.json implies" in error and "they would be random" in error, error


def test_every_step_that_loads_a_workdirs_model_checks_it(trained_small, tmp_path):
    """eval (and export, sft, rl, profile, probe: every step handed a model step's folder) refuses a model whose
    config.json implies layers its weights lack, naming the folder and the command that rewrites it."""
    from helpers.workdirs import EVAL, refused

    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    config = wd / "sft" / "model" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_hidden_layers": 6}))
    for args in (EVAL, ["export", str(tmp_path / "bundle")]):
        error = refused(wd, *args, names=[wd / "sft" / "model", "they would be random", "gencli sft --force"])
        assert error.count("config.json implies") == 1
    assert not (tmp_path / "bundle").exists() and not (wd / "eval").exists()


@pytest.mark.parametrize("kind, extra", [("qwen3", {}), ("qwen3", {"tie_word_embeddings": True}), ("qwen2", {}),
                                         ("llama", {"attention_bias": True, "mlp_bias": True})])
def test_the_expected_tensors_are_the_lean_decoders_parameters(kind, extra):
    from pathlib import Path

    from gencli.core.infer.model_check import expected_tensors
    from gencli.core.lm.lean import LeanCausalLM

    raw = {"model_type": kind, "vocab_size": 41, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 24, "rms_norm_eps": 1e-6,
           "tie_word_embeddings": False, **extra}
    config = structure(raw)
    model = LeanCausalLM(config, Path("."))
    assert expected_tensors(config) == {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())



def test_sharded_weights_are_read_header_by_header(tmp_path):
    tiny_qwen3(41).save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and model_problems(tmp_path) == []
    save_file({}, str(tmp_path / shards[0]))
    [problem] = model_problems(tmp_path)
    assert problem.startswith("the weights lack ") and "they would be random" in problem


def test_a_stray_weight_file_beside_checked_shards_is_refused(b):
    """Valid shards and their index pass the header check; a re-signed model.safetensors beside them lacking a layer
    would be what transformers loads (a partly random model): refused, naming it."""
    from safetensors.torch import load_file

    weights = load_file(str(b / "model" / "model.safetensors"))
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: weights[k] for k in keys}, str(b / "model" / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (b / "model" / "model.safetensors.index.json").write_text(json.dumps(index))
    save_file({k: v for k, v in weights.items() if ".layers.1." not in k}, str(b / "model" / "model.safetensors"),
              metadata={"format": "pt"})
    resign(b, "model/model.safetensors", "model/model.safetensors.index.json", *(f"model/{s}" for s in shards))
    refused_by_recommend(b, "model.safetensors", "beside those the index names")
    with pytest.raises(ArtifactError, match="one set of weights"):
        Recommender.load(b)
    (b / "model" / "model.safetensors").unlink()
    meta = json.loads((b / bundle.BUNDLE_JSON).read_text())
    del meta["files"]["model/model.safetensors"], meta["sha256"]["model/model.safetensors"]
    meta[CHECKSUM] = manifest_digest(meta)
    (b / bundle.BUNDLE_JSON).write_text(json.dumps(meta))
    assert len(Recommender.load(b).recommend(["i001"], k=3)) == 3  # the shards alone: checked and loaded
