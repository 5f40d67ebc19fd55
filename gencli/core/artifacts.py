"""File names of every artifact a step writes inside its step folder.

These are the contract between steps (documented in docs/formats.md). A step
asks the workspace for an upstream step's folder and joins these names; it
never takes a path from the user for something an earlier step produced.
"""

# ingest/
ITEMS = "items.parquet"  # item_idx:int32 (dense 0..n-1), item_id:str, title:str, description, category, brand, ... (str)
INTERACTIONS = "interactions.parquet"  # user_idx:int32, user_id:str, item_idx:int32, timestamp:int64, rating:float64 (nullable)
TRAIN = "train.parquet"  # user_idx:int32, user_id:str, sequence:list[int32] (chronological item_idx)
VALID = "valid.parquet"  # user_idx:int32, user_id:str, history:list[int32], target:int32
TEST = "test.parquet"  # same columns as VALID
USERS = "users.parquet"  # user_idx:int32, user_id:str

# embed/
EMBEDDINGS = "embeddings.npy"  # float32 [n_items, dim], row i = item_idx i, L2-normalised
LEXICAL = "lexical.npz"  # SciPy CSR float32 [n_items, n_terms]: BM25 weights of each item's text, rows at unit norm

# quantize/
CODEBOOKS = "codebooks.npz"  # level_0 .. level_{L-1}: float32 [K_l, dim] centroids in the normalised residual space
SIDS = "sids.parquet"  # item_idx:int32, item_id:str, codes:list[int32] (L levels + 1 dedup level)
TOKEN_MAP = "token_map.json"  # {"levels": [K_0, .., K_{L-1}, K_dedup], "tokens": [[names of level 0], ...]}

# init-vocab/, cpt/, sft/
MODEL_DIR = "model"  # plain HF folder (model + tokenizer); from_pretrained works without gencli
BLEND = "blend.json"  # sft, rl: {"blends": {policy: blend}, "by_history", "fit", "prior"} (core/infer/blendfile.py)
ITEM_PRIOR = "item_prior.npy"  # sft, rl: float64 [2, n_items]: row 0 training-target counts, row 1 the no-history
#                                prior (core/infer/prior.py); the ranking's evidence about each item
SID_VOCAB = "sid_vocab.json"  # {"token_ids": [[id of <sid_l_k> for k] for l incl. dedup], "bos_id": int|null,
#                               "eos_id": int|null, "pad_id": int, "base_vocab_size": int}
BASE_MODEL_DIR = "base"  # init-vocab/base: the tiny preset built from the catalog text (absent for other backbones)

# cpt/, sft/
METRICS_JSONL = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
BEST_DIR = "best"

# a bundle (gencli export DIR): the file that makes a folder a bundle (core/infer/bundle.py)
BUNDLE_JSON = "gencli.json"

# eval/, cold-eval/
PREDICTIONS = "predictions.parquet"
METRICS_JSON = "metrics.json"


def sid_token(level: int, code: int) -> str:
    """Name of the vocabulary token for code ``code`` at level ``level`` (dedup = last level)."""
    return f"<sid_{level}_{code}>"


def model_id(step: str, files: dict[str, str]) -> str:
    """What names a model wherever it is: its step and a digest of its files (``sft@3f2a9c1d0b7e``): the sha256 of
    every ``model/...`` file, of ``sid_vocab.json``, ``blend.json`` and ``item_prior.npy`` (how it ranks), by relative path
    (``files``: path -> sha256, as a step's ``step.json`` outputs and a bundle's ``gencli.json`` list them). A
    workdir's model and the bundle exported from it have the same id, and so do two runs that trained the same
    weights; it is every recommendation's ``model``."""
    import hashlib

    picked = sorted((path, digest) for path, digest in files.items()
                    if path.startswith(f"{MODEL_DIR}/") or path in (SID_VOCAB, BLEND, ITEM_PRIOR))
    listing = "".join(f"{path}\t{digest}\n" for path, digest in picked)
    return f"{step}@{hashlib.sha256(listing.encode()).hexdigest()[:12]}"


def bundle_model_id(meta: dict) -> str | None:
    """A bundle's model id from its gencli.json: ``model_id``, or for bundles exported before it, :func:`model_id`
    of its model step and per-file digests (None when it has neither)."""
    if isinstance(meta.get("model_id"), str) and meta["model_id"]:
        return meta["model_id"]
    source = meta.get("source") if isinstance(meta.get("source"), dict) else {}
    files = meta.get("sha256") if isinstance(meta.get("sha256"), dict) else {}
    step = source.get("model_step")
    return model_id(str(step), files) if step and files else None
