"""A model folder checked as data before any weight is read: what a bundle (or a workdir's model step) hands the
decoder must be a model gencli decodes, of a bounded size, whose weight file holds exactly the tensors its
``config.json`` implies.

transformers fills a tensor missing from the weights with a random initialisation (a warning, no error) and
allocates whatever ``config.json`` asks for before reading a byte of weights: a re-signed bundle saying
``num_hidden_layers: 6`` over 2 layers of weights, ``tie_word_embeddings: false`` over a tied model, another
``model_type``, an empty weight file, or a ``vocab_size`` of 10**12 would load as a partly random model or end in a
MemoryError. So, in this order, with no tensor allocated:

1. ``config.json``'s fields by type and range (:data:`LIMITS`), the architecture among :data:`ARCHITECTURES` (what
   the beam search decodes), heads that divide, and ``vocab_size`` covering the tokenizer's ids and every id of
   ``sid_vocab.json``;
2. the parameters the config implies at most :data:`MAX_PARAMS` (about 32 GB in float32);
3. the safetensors headers (names, shapes, dtypes: no tensor read) equal to the tensors the config implies, those of
   :class:`~gencli.core.lm.lean.LeanCausalLM` (its names are transformers').

Each problem names the file and the field or tensor; the caller adds whose folder it is and the fix.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gencli.core.infer.bundle_check import shown as _shown
from gencli.fileio import parse_json

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
"""model_type -> the one ``architectures`` entry gencli decodes (the presets: tiny is qwen3, smollm2 llama)."""
LIMITS = {
    "vocab_size": 1 << 22,
    "hidden_size": 1 << 16,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 4096,
    "intermediate_size": 1 << 20,
    "max_position_embeddings": 1 << 24,
}
"""The largest value of each integer field (the smallest is 1); SmolLM2-135M and Qwen3-8B are far inside."""
MAX_PARAMS = 8_000_000_000
"""The most parameters a model may imply (Qwen3-8B's size; 32 GB in float32): past it the load is refused before
any allocation."""
OPTIONAL = ("head_dim", "max_position_embeddings")  # head_dim absent or null: hidden_size // num_attention_heads
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
"""Files a loader of transformers (or torch) may take for weights."""
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_config(folder: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """(the parsed config.json, []) or (None, [why it cannot be read])."""
    file = Path(folder) / CONFIG
    try:
        raw = parse_json(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, [f"{CONFIG} cannot be read as JSON ({str(exc)[:120]})"]
    if not isinstance(raw, dict):
        return None, [f"{CONFIG} must hold a JSON object"]
    return raw, []


def config_problems(raw: dict[str, Any], ids: list[int] = ()) -> list[str]:
    """What is wrong with a parsed config.json for gencli's decoder; ``ids``: token ids the model must have rows for
    (the SID tokens and specials of sid_vocab.json, the tokenizer's)."""
    kind = raw.get("model_type")
    if not isinstance(kind, str) or kind not in ARCHITECTURES:
        return [f"{CONFIG} field model_type must be one of {', '.join(ARCHITECTURES)} (got {_shown(kind)})"]
    problems = []
    if raw.get("architectures") not in (None, [ARCHITECTURES[kind]]):
        problems.append(f"{CONFIG} field architectures must be [\"{ARCHITECTURES[kind]}\"] for model_type {kind} "
                        f"(got {_shown(raw.get('architectures'))})")
    for key, high in LIMITS.items():
        if raw.get(key) is None and key in OPTIONAL:
            continue
        if key not in raw:
            problems.append(f"{CONFIG} lacks the field {key}")
        elif not _int(raw[key]) or not 1 <= raw[key] <= high:
            problems.append(f"{CONFIG} field {key} must be an integer in [1, {high:,}] (got {_shown(raw[key])})")
    if not isinstance(raw.get("tie_word_embeddings"), bool):
        problems.append(f"{CONFIG} field tie_word_embeddings must be true or false (got "
                        f"{_shown(raw.get('tie_word_embeddings'))})")
    for key in ("attention_bias", "mlp_bias"):
        if not isinstance(raw.get(key, False), bool):
            problems.append(f"{CONFIG} field {key} must be true or false (got {_shown(raw[key])})")
    eps = raw.get("rms_norm_eps")
    if not _number(eps) or not 0 < eps < 1:
        problems.append(f"{CONFIG} field rms_norm_eps must be a number in (0, 1) (got {_shown(eps)})")
    theta = raw.get("rope_theta")
    if theta is not None and (not _number(theta) or theta <= 0):
        problems.append(f"{CONFIG} field rope_theta must be a positive number (got {_shown(theta)})")
    for key in ("rope_parameters", "rope_scaling"):  # transformers 5 reads rope_theta from rope_parameters
        nested = raw.get(key)
        if nested is not None and not isinstance(nested, dict):
            problems.append(f"{CONFIG} field {key} must be an object (got {_shown(nested)})")
        elif nested is not None and "rope_theta" in nested and (not _number(nested["rope_theta"]) or
                                                                 nested["rope_theta"] <= 0):
            problems.append(f"{CONFIG} field {key}.rope_theta must be a positive number (got "
                            f"{_shown(nested['rope_theta'])})")
    if problems:
        return problems
    if raw["num_attention_heads"] % raw["num_key_value_heads"]:
        problems.append(f"{CONFIG}: num_attention_heads ({raw['num_attention_heads']}) must be a multiple of "
                        f"num_key_value_heads ({raw['num_key_value_heads']})")
    if raw.get("head_dim") is None and raw["hidden_size"] % raw["num_attention_heads"]:
        problems.append(f"{CONFIG}: without head_dim, hidden_size ({raw['hidden_size']}) must be a multiple of "
                        f"num_attention_heads ({raw['num_attention_heads']})")
    beyond = max(ids, default=-1)
    if beyond >= raw["vocab_size"]:
        problems.append(f"{CONFIG} field vocab_size ({raw['vocab_size']}) has no row for token id {beyond} (the "
                        "tokenizer's or sid_vocab.json's)")
    return problems


def structure(raw: dict[str, Any]):
    """The :class:`~gencli.core.lm.lean.LeanConfig` of a config that :func:`config_problems` passed: what decides
    the tensors' names and shapes (the numbers that do not, rope and eps, as the config says or 1.0)."""
    from gencli.core.lm.lean import LeanConfig

    kind = raw["model_type"]
    heads = raw["num_attention_heads"]
    bias = kind == "qwen2" or raw.get("attention_bias", False)
    return LeanConfig(kind, raw["vocab_size"], raw["hidden_size"], raw["num_hidden_layers"], heads,
                      raw["num_key_value_heads"], raw.get("head_dim") or raw["hidden_size"] // heads,
                      raw["intermediate_size"], float(raw["rms_norm_eps"]), float(raw.get("rope_theta") or 1.0),
                      raw["tie_word_embeddings"], qkv_bias=bias, o_bias=kind != "qwen2" and bias,
                      mlp_bias=kind == "llama" and raw.get("mlp_bias", False))


def parameter_count(config) -> int:
    """The parameters a :class:`LeanConfig` implies (exact, in Python integers: no overflow, no allocation)."""
    return sum(math.prod(shape) for shape in expected_tensors(config).values())


def expected_tensors(config) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor the weights must hold: :class:`~gencli.core.lm.lean.LeanCausalLM`'s parameters
    (transformers' names), written out rather than built (a meta-device model imports torch._dynamo, seconds of a
    query; tests/core/infer/test_bundle_model.py keeps the two equal); a tied ``lm_head.weight`` is absent."""
    c = config
    hidden, head, heads, kv, inner = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads, \
        c.intermediate_size
    out = {"model.embed_tokens.weight": (c.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, hidden)
    layer = {"self_attn.q_proj.weight": (heads * head, hidden), "self_attn.k_proj.weight": (kv * head, hidden),
             "self_attn.v_proj.weight": (kv * head, hidden), "self_attn.o_proj.weight": (hidden, heads * head),
             "mlp.gate_proj.weight": (inner, hidden), "mlp.up_proj.weight": (inner, hidden),
             "mlp.down_proj.weight": (hidden, inner), "input_layernorm.weight": (hidden,),
             "post_attention_layernorm.weight": (hidden,)}
    if c.qkv_bias:
        layer.update({"self_attn.q_proj.bias": (heads * head,), "self_attn.k_proj.bias": (kv * head,),
                      "self_attn.v_proj.bias": (kv * head,)})
    if c.o_bias:
        layer["self_attn.o_proj.bias"] = (hidden,)
    if c.qk_norm:
        layer.update({"self_attn.q_norm.weight": (head,), "self_attn.k_norm.weight": (head,)})
    if c.mlp_bias:
        layer.update({"mlp.gate_proj.bias": (inner,), "mlp.up_proj.bias": (inner,), "mlp.down_proj.bias": (hidden,)})
    for i in range(c.num_hidden_layers):
        out.update({f"model.layers.{i}.{name}": shape for name, shape in layer.items()})
    return out


def header_tensors(folder: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], list[str]]:
    """(name -> (dtype, shape) of every tensor of the folder's safetensors weights, problems), read from the
    headers alone (safetensors checks each header against its file's size on open)."""
    from safetensors import safe_open

    folder = Path(folder)
    problems: list[str] = []
    if (folder / INDEX).is_file():
        try:
            weight_map = parse_json((folder / INDEX).read_text(encoding="utf-8")).get("weight_map")
            files = sorted({str(v) for v in weight_map.values()})
        except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
            return {}, [f"{INDEX} is not a valid index ({str(exc)[:120]})"]
    elif (folder / WEIGHTS).is_file():
        files = [WEIGHTS]
    else:
        return {}, [f"no {WEIGHTS} (gencli reads safetensors weights only)"]
    kept = {*files, INDEX} if (folder / INDEX).is_file() else {WEIGHTS}
    stray = stray_weights(folder, kept)
    if stray:
        return {}, [f"{_names(stray)}: weight file(s) beside those {'the index names' if INDEX in kept else WEIGHTS} "
                    "(a loader may read them instead of the checked ones); keep one set of weights per model folder"]
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name in files:
        try:
            with safe_open(str(folder / name), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has keys(), no iteration
                    part = f.get_slice(key)
                    if key in found:
                        problems.append(f"tensor {_shown(key)} is in two weight files")
                    found[key] = (str(part.get_dtype()), tuple(int(n) for n in part.get_shape()))
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a damaged header
            problems.append(f"{name} is not a readable safetensors file ({str(exc)[:120]})")
    return found, problems


def stray_weights(folder: Path, keep: set[str]) -> list[str]:
    """Weight files (or indexes) of the folder other than ``keep``: transformers prefers a ``model.safetensors`` to
    an index of shards, so a stray one would be loaded unchecked."""
    found = []
    for entry in sorted(Path(folder).iterdir()):
        name = entry.name
        if name not in keep and (name.endswith(WEIGHT_SUFFIXES) or name.endswith(".index.json")):
            found.append(name)
    return found


def tensor_problems(config, found: dict[str, tuple[str, tuple[int, ...]]]) -> list[str]:
    """The weights against the config: a missing, extra or reshaped tensor, or one that is not floating point."""
    expected = expected_tensors(config)  # tied: no lm_head.weight (an untied model's head would be dropped unread)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    problems = []
    if missing:
        problems.append(f"the weights lack {len(missing)} tensor(s) {CONFIG} implies ({_names(missing)}): they would "
                        "be random")
    if extra:
        problems.append(f"the weights hold {len(extra)} tensor(s) {CONFIG} does not imply ({_names(extra)})")
    shaped = [f"{name} {list(found[name][1])} (config: {list(shape)})" for name, shape in expected.items()
              if name in found and found[name][1] != shape]
    if shaped:
        problems.append(f"tensor shapes differ from {CONFIG}: {'; '.join(shaped[:3])}")
    kinds = sorted({dtype for dtype, _ in found.values()} - FLOAT_DTYPES)
    if kinds:
        problems.append(f"the weights hold tensors of type {', '.join(kinds)} (a model's are F16, BF16 or F32)")
    return problems


def tokenizer_ids(folder: Path) -> list[int]:
    """The largest token id of the folder's tokenizer.json (vocabulary and added tokens), as a one-item list; [] when
    it has none or it cannot be read (transformers reports a broken tokenizer where one is loaded)."""
    try:
        raw = parse_json((Path(folder) / TOKENIZER).read_text(encoding="utf-8"))
        vocab = raw.get("model", {}).get("vocab")
        ids = [v for v in vocab.values()] if isinstance(vocab, dict) else list(range(len(vocab or [])))
        ids += [t.get("id") for t in raw.get("added_tokens") or []]
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, TypeError):
        return []
    ids = [i for i in ids if _int(i)]
    return [max(ids)] if ids else []


def model_problems(folder: Path, sid_ids: list[int] = (), max_params: int = MAX_PARAMS) -> list[str]:
    """Everything wrong with the model folder ``folder`` (config, size, weight headers), in that order, with no
    tensor read or allocated; ``sid_ids``: the ids sid_vocab.json gives the model."""
    raw, problems = read_config(folder)
    if raw is None:
        return problems
    problems = config_problems(raw, [*sid_ids, *tokenizer_ids(folder)])
    if problems:
        return problems
    config = structure(raw)
    params = parameter_count(config)
    if params > max_params:
        return [f"{CONFIG} implies {params:,} parameters, more than gencli loads ({max_params:,}): its sizes are "
                "damaged or not a recommender's"]
    found, problems = header_tensors(folder)
    return problems or tensor_problems(config, found)


def check_step_model(model_dir: Path, vocab_path: Path) -> None:
    """ArtifactError (naming the folder, which the workspace turns into the command that rewrites it) when a model
    step's folder fails :func:`model_problems`: every step that loads a workdir's model checks it as a bundle's."""
    from gencli.core.lm.prompt import load_sid_vocab
    from gencli.errors import ArtifactError

    problems = model_problems(model_dir, sid_vocab_ids(load_sid_vocab(vocab_path)))
    if problems:
        raise ArtifactError(f"model folder {model_dir}: {'; '.join(problems[:3])}", damaged=Path(model_dir))


def sid_vocab_ids(vocab) -> list[int]:
    """Every id a :class:`~gencli.core.lm.prompt.SidVocab` gives the model: its SID tokens and specials."""
    return [*vocab.all_ids, *(i for i in (vocab.bos_id, vocab.eos_id, vocab.pad_id) if i is not None)]


def _names(names: list[str]) -> str:
    shown = ", ".join(_shown(n, 80) for n in names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


