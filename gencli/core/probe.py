"""What the SID token embeddings encode: category purity, geometric scale and popularity/category variance.

For one SID level, each code k has an embedding row (a model's input embedding of ``<sid_l_k>``,
or the quantizer's centroid). The probe asks whether neighbouring rows share their items'
category (purity), how spread the rows are (sigma_geo) and how much of the item popularity
or of the category lies along the leading principal directions (R^2_q). Definitions, with
their normalisations, are in :func:`purity`, :func:`sigma_geo` and :func:`variance_fraction`
and in docs/formats.md (probe.json).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gencli.config import ProbeConfig
from gencli.core.progress import SILENT, Progress
from gencli.errors import ArtifactError, InputError
from gencli.fileio import parse_json

PROBE_JSON = "probe.json"
QS = (1, 3, 5)

BASELINE_SPACES = ("random", "semantic")  # probe.json rows before the model steps' (a random subspace, the codebook)


# ---- labels and targets per code --------------------------------------------------------------
def item_category(value: str | None, rule: str) -> str | None:
    """One category per item from the (possibly multi-valued, comma-separated) ``category`` text.

    ``first``: the first comma-separated value (MovieLens: the first genre in the dataset's genre order);
    ``last``: the last one (Amazon's category paths end with the most specific); ``whole``: the full text.
    Empty values give None (the item is ignored for categories).
    """
    if value is None:
        return None
    if rule == "whole":
        text = value.strip()
        return text or None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts:
        return None
    return parts[0] if rule == "first" else parts[-1]


def code_categories(level_codes: np.ndarray, labels: Sequence[str | None], k: int) -> list[str | None]:
    """cat(k): the majority category of the items with code k (ties: alphabetically first); None without one."""
    counters: list[Counter] = [Counter() for _ in range(k)]
    for code, label in zip(np.asarray(level_codes).tolist(), labels, strict=True):
        if label is not None:
            counters[code][label] += 1
    out: list[str | None] = []
    for counter in counters:
        out.append(min(counter, key=lambda c: (-counter[c], c)) if counter else None)
    return out


def code_counts(level_codes: np.ndarray, item_counts: np.ndarray, k: int) -> np.ndarray:
    """n_k: the summed counts of the items with code k (int64, length k)."""
    return np.bincount(np.asarray(level_codes, np.int64), weights=np.asarray(item_counts, np.float64),
                       minlength=k).round().astype(np.int64)


def one_hot(cats: Sequence[str]) -> np.ndarray:
    """[n, C] one-hot of the labels (columns in sorted label order)."""
    names = sorted(set(cats))
    index = {c: i for i, c in enumerate(names)}
    out = np.zeros((len(cats), len(names)))
    out[np.arange(len(cats)), [index[c] for c in cats]] = 1.0
    return out


# ---- the metrics ------------------------------------------------------------------------------
def purity(emb: np.ndarray, cats: Sequence[str], m: int) -> float | None:
    """P_m: mean over rows of the share of its m cosine nearest neighbours (other rows) with the same label.

    m is capped at n - 1; ties in similarity go to the lower row index. None with fewer than 2 rows.
    """
    emb = np.asarray(emb, np.float64)
    n = len(cats)
    if n < 2:
        return None
    m = min(m, n - 1)
    unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    sim = unit @ unit.T
    np.fill_diagonal(sim, -np.inf)
    neighbours = np.argsort(-sim, axis=1, kind="stable")[:, :m]
    labels = np.asarray(one_hot(cats).argmax(axis=1))
    return float((labels[neighbours] == labels[:, None]).mean())


def random_purity(cats: Sequence[str]) -> float | None:
    """Exact expectation of P_m when the m neighbours are drawn at random among the other rows:
    sum_c n_c (n_c - 1) / (n (n - 1)), the same for every m."""
    n = len(cats)
    if n < 2:
        return None
    sizes = np.array(list(Counter(cats).values()), np.float64)
    return float((sizes * (sizes - 1)).sum() / (n * (n - 1)))


def random_r2(n: int, q: int) -> float | None:
    """Expected R^2_q of any fixed target when the q directions are a random subspace of the n - 1 centred
    dimensions: q / (n - 1) (q capped at n - 1). The chance level the model's R^2 values compare to."""
    return min(q, n - 1) / (n - 1) if n > 1 else None


def random_row(n_used: int, n_labelled: int, qs: Sequence[int] = QS) -> dict[str, Any]:
    """The random baseline's R^2 columns (T_pop over the used codes, T_sem over the labelled ones)."""
    row: dict[str, Any] = {f"r2_pop@{q}": random_r2(n_used, q) for q in qs}
    row.update({f"r2_sem@{q}": random_r2(n_labelled, q) if n_labelled else None for q in qs})
    return row


def max_purity(cats: Sequence[str], m: int) -> float | None:
    """The highest P_m any embedding can reach: a code of a category with n_c codes has at most n_c - 1
    same-category neighbours, so mean over codes of min(m, n_c - 1) / m (m capped at n - 1)."""
    n = len(cats)
    if n < 2:
        return None
    m = min(m, n - 1)
    sizes = Counter(cats)
    return float(np.mean([min(m, sizes[c] - 1) / m for c in cats]))


def _centred_svd(emb: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(U, singular values, rank r = min(n - 1, d)) of the row-centred matrix (centring removes one dimension)."""
    emb = np.asarray(emb, np.float64)
    centred = emb - emb.mean(axis=0, keepdims=True)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    return u, s, max(min(emb.shape[0] - 1, emb.shape[1]), 0)


def sigma_geo(emb: np.ndarray) -> float | None:
    """Geometric mean of the top r = min(n - 1, d) singular values of the row-centred [n, d] matrix,
    divided by sqrt(n) (so it is a per-row scale; rows of iid N(0, s^2) give about s). 0 when the rows
    span fewer than r directions; None with fewer than 2 rows."""
    _, s, r = _centred_svd(emb)
    if r < 1:
        return None
    top = s[:r] / np.sqrt(len(emb))
    if top[-1] <= 1e-9 * max(top[0], 1e-30):
        return 0.0
    return float(np.exp(np.log(top).mean()))


def variance_fraction(emb: np.ndarray, target: np.ndarray, qs: Sequence[int] = QS) -> dict[int, float | None]:
    """R^2_q(T) = ||Z_q Z_q^T T||_F^2 / ||T||_F^2 for the column-centred target T [n] or [n, c], Z_q the
    top-q left singular vectors of the row-centred embeddings (the leading principal components' scores).
    q is capped at the rank; None for a constant target."""
    u, s, r = _centred_svd(emb)
    t = np.asarray(target, np.float64)
    t = (t[:, None] if t.ndim == 1 else t) - t.reshape(len(t), -1).mean(axis=0, keepdims=True)
    total = float((t**2).sum())
    rank = int((s[:r] > 1e-9 * max(s[0] if len(s) else 0.0, 1e-30)).sum())
    out: dict[int, float | None] = {}
    for q in qs:
        if total <= 1e-12 or rank == 0:
            out[q] = None
            continue
        z = u[:, : min(q, rank)]
        out[q] = float(((z.T @ t) ** 2).sum() / total)
    return out


def probe_space(emb: np.ndarray, used: np.ndarray, labelled: np.ndarray, cats: Sequence[str | None],
                counts: np.ndarray, m: int, qs: Sequence[int] = QS) -> dict[str, Any]:
    """Every metric of one embedding space [K, d] over its used codes (R^2 of T_sem and P_m on the labelled ones)."""
    emb = np.asarray(emb, np.float64)
    row: dict[str, Any] = {"sigma_geo": sigma_geo(emb[used])}
    pop = variance_fraction(emb[used], np.log1p(counts[used]), qs)
    row.update({f"r2_pop@{q}": v for q, v in pop.items()})
    labels = [cats[k] for k in labelled]
    sem = variance_fraction(emb[labelled], one_hot(labels), qs) if len(set(labels)) > 1 else dict.fromkeys(qs)
    row.update({f"r2_sem@{q}": v for q, v in sem.items()})
    row["purity"] = purity(emb[labelled], labels, m) if labels else None
    return row


# ---- one probe over a workdir's model steps ---------------------------------------------------
def model_rows(model_dir: Path, token_ids: Sequence[int]) -> np.ndarray:
    """The input embedding rows of ``token_ids`` in a model folder (float64 [len, hidden])."""
    import torch

    from gencli.core.lm.backbone import load_model

    model, _ = load_model(model_dir, device="cpu", dtype=torch.float32, min_vocab=max(token_ids) + 1)
    with torch.no_grad():
        rows = model.get_input_embeddings().weight[torch.as_tensor(list(token_ids))].double().numpy()
    return rows


def run(cfg: ProbeConfig, models: Mapping[str, tuple[Path, Sequence[Sequence[int]]]], codebooks: Sequence[np.ndarray],
        codes: np.ndarray, categories: Sequence[str | None] | None, item_counts: np.ndarray, out_dir: Path,
        progress: Progress = SILENT, geometry: Mapping[str, dict] | None = None) -> dict[str, Any]:
    """Probe level ``cfg.level`` of the quantizer's centroids and of every model step in ``models``
    (step -> (model folder, sid_vocab token_ids)); write probe.json (and pictures) into ``out_dir``.

    ``categories``: the items' ``category`` text (None when the catalog has none); ``item_counts``: per item,
    how often it is a training target (popularity); ``geometry``: per step, where its SID rows sit and whether it
    tells users apart (:func:`model_geometry`), reported as it is.
    """
    level, m, qs = cfg.level, cfg.m, tuple(QS)
    if not 0 <= level < len(codebooks):
        raise InputError(f"--level {level} is out of range: the quantizer has levels 0..{len(codebooks) - 1} "
                         "(the dedup level has no centroids); choose one of them")
    k = len(codebooks[level])
    level_codes = np.asarray(codes)[:, level]
    labels = [item_category(v, cfg.category_rule) for v in categories] if categories is not None else []
    cats = code_categories(level_codes, labels, k) if any(x is not None for x in labels) else [None] * k
    counts = code_counts(level_codes, item_counts, k)
    used = np.flatnonzero(np.bincount(level_codes, minlength=k) > 0)
    labelled = np.array([c for c in used if cats[c] is not None], dtype=np.int64)
    n_cats = len({cats[c] for c in labelled})
    note = None
    if len(labelled) == 0:
        note = "the items have no category, so purity and R^2 of T_sem are not computed (give items a category column)"
    elif n_cats < 2:
        note = "every labelled code has the same category, so purity is trivially 1 and R^2 of T_sem is undefined"
    untouched = int(((counts == 0)).sum())
    result: dict[str, Any] = {
        "level": level, "m": m, "q": list(qs), "category_rule": cfg.category_rule,
        "codes": k, "used_codes": int(len(used)), "labelled_codes": int(len(labelled)), "categories": n_cats,
        "purity_max": max_purity([cats[c] for c in labelled], m),
        "untouched_tokens": untouched, "untouched_share": untouched / k, "note": note,
    }
    rows = [{"space": BASELINE_SPACES[0], **random_row(len(used), len(labelled) if n_cats > 1 else 0, qs),
             "purity": random_purity([cats[c] for c in labelled])},
            {"space": BASELINE_SPACES[1], **probe_space(codebooks[level], used, labelled, cats, counts, m, qs)}]
    spaces = {"semantic": np.asarray(codebooks[level], np.float64)}
    first = None
    with progress.track("probing model steps", total=len(models)) as advance:
        for step, (model_dir, token_ids) in models.items():
            ids = token_ids[level] if level < len(token_ids) else []
            if len(ids) != k:
                raise ArtifactError(f"'{step}' has {len(ids)} SID tokens at level {level} but the quantizer has {k} "
                                    f"codes there; the model and quantize come from different runs: rerun `gencli {step}`")
            emb = model_rows(model_dir, ids)  # the one model loader refuses inf or NaN weights (a diverged run)
            row = {"space": step, **probe_space(emb, used, labelled, cats, counts, m, qs)}
            first = emb if first is None else first
            row["drift"] = float(np.linalg.norm(emb - first) / max(np.linalg.norm(first), 1e-12))
            rows.append(row)
            spaces[step] = emb
            advance(1)
    result["rows"] = rows
    if geometry:
        result["geometry"] = dict(geometry)
    out_dir.mkdir(parents=True, exist_ok=True)
    result["pictures"] = []
    if cfg.pictures:
        from gencli.core import probe_plots

        result["pictures"] = probe_plots.draw(out_dir, spaces, used, cats, counts, rows, level, m,
                                              ceiling=result["purity_max"])
    (out_dir / PROBE_JSON).write_text(json.dumps(result, indent=2) + "\n")
    return result


# ---- comparing two probes (the paper's Table 2) -----------------------------------------------
def load_probe(workdir: Path) -> dict[str, Any]:
    """A workdir's probe/probe.json; InputError naming the file and the fix when absent or damaged."""
    path = Path(workdir) / "probe" / PROBE_JSON
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} does not exist; run `gencli probe --workdir {workdir}` first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path} is not valid JSON ({e}); rerun `gencli probe --force --workdir {workdir}`") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise InputError(f"{path} has no 'rows'; rerun `gencli probe --force --workdir {workdir}`")
    return data


def compare(a: dict[str, Any], b: dict[str, Any], step: str = "auto") -> dict[str, Any]:
    """Per metric: A's and B's value at ``step`` (auto: the most trained step both have) and delta = B - A."""
    problems = [f"{key} differs (A: {a.get(key)}, B: {b.get(key)})" for key in ("level", "m", "category_rule")
                if a.get(key) != b.get(key)]
    if problems:
        raise InputError("the two probes are not comparable: " + "; ".join(problems)
                         + "; rerun `gencli probe` in both with the same --level, --m and --category-rule")
    rows_a = {r["space"]: r for r in a["rows"]}
    rows_b = {r["space"]: r for r in b["rows"]}
    # the model steps' rows follow the two baselines in pipeline order: the most trained comes last
    common = [s for s in reversed(rows_a) if s not in BASELINE_SPACES and s in rows_b]
    if step == "auto":
        if not common:
            raise InputError("the two probes share no model step (init-vocab, cpt, sft, rl); probe trained workdirs")
        step = common[0]
    elif step not in common:
        raise InputError(f"'{step}' is not probed in both workdirs (both have: {', '.join(common) or 'none'})")
    keys = ["sigma_geo", *[f"r2_pop@{q}" for q in a["q"]], *[f"r2_sem@{q}" for q in a["q"]], "purity"]
    table = []
    for key in keys:
        va, vb = rows_a[step].get(key), rows_b[step].get(key)
        delta = vb - va if va is not None and vb is not None else None
        table.append({"metric": key, "a": va, "b": vb, "delta": delta})
    return {"step": step, "level": a["level"], "m": a["m"], "rows": table}


def run_step(cfg: Any, inputs, out_dir: Path, progress: Progress = SILENT) -> dict[str, Any]:
    """The probe step: every finished model step's SID rows, quantize's codebooks, ingest's categories and counts."""
    import polars as pl

    from gencli.core.data import tables
    from gencli.core.lm.prompt import load_sid_vocab

    items = inputs.items()
    counts = tables.train_target_counts(inputs.split("train"), items.height)
    categories = items["category"].cast(pl.String).to_list() if "category" in items.columns else None
    codes, _ = inputs.codes()
    sequences = inputs.split("train")["sequence"].to_list()
    models, shapes = {}, {}
    for step in inputs.model_steps:
        model_dir, vocab_path = inputs.model(step)
        vocab = load_sid_vocab(vocab_path)
        models[step] = (model_dir, vocab.token_ids)
        shapes[step] = model_geometry(model_dir, vocab, codes, sequences)
    return run(cfg, models, inputs.codebooks(), codes, categories, counts, out_dir, progress, geometry=shapes)


def model_geometry(model_dir: Path, vocab, codes: np.ndarray, sequences: Sequence[Sequence[int]]) -> dict[str, Any]:
    """init-vocab's geometry record (:mod:`gencli.core.lm.geometry`) of a trained model: its SID rows against the
    base rows, and the spread of its last hidden state over the same seeded users."""
    import torch

    from gencli.config import SFT_MAX_HISTORY
    from gencli.core.lm import geometry
    from gencli.core.lm.backbone import load_model
    from gencli.core.lm.prompt import item_token_ids

    model, _ = load_model(model_dir, device="cpu", dtype=torch.float32)
    prompts = geometry.sample_prompts(sequences, item_token_ids(codes, vocab), SFT_MAX_HISTORY, vocab.bos_id)
    return geometry.report(model, vocab.token_ids, vocab.base_vocab_size, prompts, vocab.pad_id)
