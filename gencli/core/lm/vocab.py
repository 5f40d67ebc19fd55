"""init-vocab: add one token per semantic-ID code to a backbone and initialise its rows.

Tokens: ``<sid_l_k>`` (:func:`gencli.core.artifacts.sid_token`) for every level l of the
codebooks and every code k, plus the dedup level (index L). They are added as special
tokens (never split by the tokenizer) with contiguous ids starting at
``base_vocab_size`` = the tokenizer's size before, ordered level by level, code by code.
The embedding matrix (and an untied lm_head) is resized; base rows stay bit-identical.

Notation: E [V, d_model] are the base vocabulary's input rows (float64 for the
statistics), mu = mean_v E_v, Sigma = (E - mu)^T (E - mu) / V, r = mean_v ||E_v - mu||
(the base "spread"). C_l [K_l, d] are the level-l codebook centroids, cbar_l their mean.
Every new row is e = mu + delta; the initialisers differ in delta:

- ``mean``:     delta = 0, so every new row is exactly mu (HF's own resize is this plus
                eps = 1e-9 noise).
- ``random``:   delta = sqrt(eps) * A z, z ~ N(0, I) from ``torch.Generator`` seeded with
                ``seed``, A = V diag(sqrt(max(w, 0))) from the eigendecomposition
                Sigma = V diag(w) V^T (PSD-safe), so e ~ N(mu, eps * Sigma).
- ``centroid``: delta_{l,k} = Phi_l(c_{l,k} - cbar_l) ("Preserving Item Semantics for Free"; the paper has one
                Phi for every level, a truncation, and no rescaling: ``--projection truncate --scale none``),
                Phi_l: R^d -> R^d_model by ``projection``:
                  principal the ``pca`` coordinates (below) placed on the base vocabulary's top m principal
                            directions (eigenvectors of Sigma, largest first): an isometry per level into the subspace
                            the backbone's rows use (the default); every level's top axis lands on the same direction;
                  shared    one map for every level: the top m = min(d, sum K_l, d_model) principal axes of all
                            levels' centred centroids together, placed on the base's top m principal directions;
                            distance-preserving within and across levels, so an item's rows keep the text's
                            relation (its vector is about the sum of its codes' centroids);
                  pca       coordinates of the level's centred centroids in their top
                            m = min(d, K_l, d_model) principal directions (SVD, signs fixed so
                            each direction's largest entry is positive), zero-padded to d_model;
                            distance-preserving whenever m >= rank(C_l - cbar_l);
                  truncate  the first d_model dims, zero-padded when d < d_model (the paper's Phi);
                  isometric Q x with Q [d_model, d] orthonormal columns (QR of a Gaussian
                            matrix seeded with ``seed``, signs fixed by diag(R) > 0); needs
                            d <= d_model; preserves all distances exactly.
                ``scale`` then: ``level`` (the default) multiplies a level whose mean ||delta_{l,k}|| is below r by
                r / mean_k ||delta_{l,k}||, so its rows lie at least as far from mu as base rows do (a level already
                farther, as on ``tiny``'s small random rows, is kept: rescaling it down cost 7% of the sample's served
                Recall@10, docs/benchmarks.md); ``shared`` multiplies every level by the one factor
                r / mean_k ||delta_{0,k}|| (level 0 at the base spread, the residual levels keeping their size
                relative to it, so the frame stays one frame); ``none`` keeps delta (the paper's: the centred
                centroids of unit-norm text vectors are short, 0.4-0.7, and on a pretrained vocabulary, smollm2's
                r = 2.39, the rows nearly coincide with mu after the first norm).
- ``gti``:      grounded token init (see :mod:`gencli.core.lm.gti`): g_t = P(s_t) fitted to the
                frozen LM's mean-pooled text states of the items using token t, starting
                from the ``random`` rows s_t; then per level delta = (g - mean g) * r / mean ||g - mean g||.
                ``gti_placement`` hidden (the default) keeps g - mean g where the fit put it, in the hidden-state
                directions that ground it; principal first places it like the ``principal`` centroids (its PCA
                coordinates on the base principal directions).

``init`` may name one init per level (``centroid,mean,mean``): each level's rows are then the rows that init gives
it, computed as above. The dedup level carries no meaning: with one name it starts as ``random`` (for centroid) or
by that init; with a list, by the list's extra last name or else as ``random`` (the same draws ``random`` gives it).

Untied lm_head: its new rows use the same formula with the output matrix's own mu,
Sigma and r and the same random draws / projections (the output rows live on another scale).
Everything is computed in float64 from float32 weights and saved in float32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken

from gencli.config import SFT_MAX_HISTORY, InitVocabConfig
from gencli.core import artifacts
from gencli.core.device import resolve_device, resolve_dtype
from gencli.core.lm import frames, geometry, gti
from gencli.core.lm.backbone import load_model, save_model, special_ids
from gencli.core.progress import SILENT, Progress
from gencli.errors import ArtifactError, ConfigError, InputError

STAT_CHUNK_ROWS = 8192  # rows per covariance chunk, so a 150k x 4k vocabulary never needs a float64 copy


@dataclass
class BaseStats:
    """Statistics of the base vocabulary rows of one matrix (float64, on the CPU)."""

    mu: torch.Tensor  # [d]
    cov: torch.Tensor  # [d, d], population covariance
    centred_norm_mean: float  # r = mean ||E_v - mu||
    norm_mean: float  # mean ||E_v||

    @cached_property
    def eigen(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Eigenvalues (clipped at 0) and eigenvectors (columns) of Sigma, largest first."""
        w, v = torch.linalg.eigh(self.cov)
        return w.flip(0).clamp(min=0), v.flip(1)

    @cached_property
    def sampler(self) -> torch.Tensor:
        """A with A A^T = Sigma (eigendecomposition, negative round-off eigenvalues clipped)."""
        w, v = self.eigen
        return v * w.sqrt()


@torch.no_grad()
def base_stats(weight: torch.Tensor, n_base: int, chunk_rows: int = STAT_CHUNK_ROWS) -> BaseStats:
    """mu, Sigma, mean centred norm and mean norm of ``weight[:n_base]``, in float64 (chunked)."""
    rows = weight[:n_base]
    d = rows.shape[1]
    chunks = range(0, n_base, chunk_rows)
    total = torch.zeros(d, dtype=torch.float64, device=rows.device)
    for start in chunks:
        total += rows[start:start + chunk_rows].double().sum(0)
    mu = total / n_base
    cov = torch.zeros(d, d, dtype=torch.float64, device=rows.device)
    centred_norm_sum = norm_sum = 0.0
    for start in chunks:
        chunk = rows[start:start + chunk_rows].double()
        centred = chunk - mu
        cov += centred.T @ centred
        centred_norm_sum += float(centred.norm(dim=1).sum())
        norm_sum += float(chunk.norm(dim=1).sum())
    return BaseStats(mu.cpu(), (cov / n_base).cpu(), centred_norm_sum / n_base, norm_sum / n_base)


def random_directions(n: int, d: int, seed: int) -> torch.Tensor:
    """z ~ N(0, I) [n, d] in float64; shared by the input and output matrices."""
    return torch.randn(n, d, generator=frames.seeded(seed, 0), dtype=torch.float64)


def check_inputs(cfg: InitVocabConfig, item_texts: list[str], codebooks: list[np.ndarray], sids: np.ndarray,
                  token_map: dict) -> list[int]:
    """Every inconsistency between the quantize artifacts at once; returns the per-level sizes."""
    problems: list[str] = []
    levels = list(token_map.get("levels", []))
    n_levels = len(codebooks)
    if n_levels == 0:
        problems.append(f"{artifacts.CODEBOOKS} holds no codebook level")
    if len(levels) != n_levels + 1:
        problems.append(f"{artifacts.TOKEN_MAP} lists {len(levels)} levels but {artifacts.CODEBOOKS} has {n_levels} "
                        f"codebooks (+1 dedup level expected)")
    if sids.ndim != 2 or sids.shape[1] != len(levels):
        problems.append(f"{artifacts.SIDS} codes have shape {tuple(sids.shape)}; expected [n_items, {len(levels)}]")
    dims = {np.asarray(cb).shape[1] for cb in codebooks if np.asarray(cb).ndim == 2}
    if len(dims) > 1:
        problems.append(f"{artifacts.CODEBOOKS} levels have different dims {sorted(dims)}")
    for level, cb in enumerate(codebooks):
        if level < len(levels) and np.asarray(cb).shape[0] != levels[level]:
            problems.append(f"codebook level_{level} has {np.asarray(cb).shape[0]} rows but {artifacts.TOKEN_MAP} "
                            f"says {levels[level]}")
    tokens = token_map.get("tokens", [])
    for level, size in enumerate(levels):
        want = [artifacts.sid_token(level, k) for k in range(size)]
        if level >= len(tokens) or list(tokens[level]) != want:
            problems.append(f"{artifacts.TOKEN_MAP} tokens of level {level} are not {want[:2]}..")
    if not problems and sids.size:
        bad = [lvl for lvl, size in enumerate(levels) if sids[:, lvl].min() < 0 or sids[:, lvl].max() >= size]
        if bad:
            problems.append(f"{artifacts.SIDS} has codes outside [0, K) at levels {bad}")
    if cfg.uses("gti") and len(item_texts) != sids.shape[0]:
        problems.append(f"{len(item_texts)} item texts for {sids.shape[0]} items in {artifacts.SIDS}")
    if problems:
        raise ArtifactError("the quantize artifacts are inconsistent: " + "; ".join(problems)
                            + "; rerun: gencli quantize --force")
    n = len(levels) - 1
    inits = cfg.level_inits(len(levels))
    if inits is None:
        raise ConfigError("init-vocab", [f"--init {cfg.init} names {len(cfg.methods)} inits, but the SIDs have {n} "
                                         f"codebook levels and a dedup level: give one init for every level, {n} "
                                         f"(one per codebook level) or {n + 1} (and the dedup level's last)"])
    if inits[-1] == "centroid":
        raise ConfigError("init-vocab", [f"--init {cfg.init}: the dedup level (the last name of {n + 1}) has no "
                                         "centroids; give it random, mean or gti"])
    return levels


def add_sid_tokens(tokenizer, levels: list[int]) -> list[list[int]]:
    """Add ``<sid_l_k>`` as special tokens; their ids per level (contiguous from the old size)."""
    names = [artifacts.sid_token(lvl, k) for lvl, size in enumerate(levels) for k in range(size)]
    existing = tokenizer.get_vocab()
    clash = [n for n in names if n in existing]
    if clash:
        raise InputError(f"the model's tokenizer already has SID tokens ({', '.join(clash[:3])}, ..); give init-vocab "
                         "a base model without SID tokens, not the output of init-vocab, cpt or sft")
    start = len(tokenizer)
    tokenizer.add_tokens([AddedToken(n, special=True, normalized=False) for n in names], special_tokens=True)
    ids = tokenizer.convert_tokens_to_ids(names)
    if ids != list(range(start, start + len(names))):
        raise InputError("the tokenizer did not give the SID tokens contiguous ids; use another base model")
    out, offset = [], 0
    for size in levels:
        out.append(ids[offset:offset + size])
        offset += size
    return out


def new_rows(cfg: InitVocabConfig, stats: BaseStats, levels: list[int], z: torch.Tensor,
             codebooks: list[np.ndarray] | None, gti_g: torch.Tensor | None) -> torch.Tensor:
    """All new rows [sum(levels), d_model] in float64 for one matrix with base statistics ``stats``."""
    inits = cfg.level_inits(len(levels))
    bounds = np.cumsum([0, *levels])
    random = stats.mu + (z @ stats.sampler.T) * cfg.eps ** 0.5 if "random" in inits else None
    centroid = None
    if "centroid" in inits:
        basis = stats.eigen[1] if cfg.projection in ("principal", "shared") else None
        centroid = frames.scaled(frames.centroid_directions(codebooks, stats.mu.shape[0], cfg.projection, cfg.seed,
                                                            basis), stats.centred_norm_mean, cfg.scale)
    blocks = []
    for level, method in enumerate(inits):
        start, end = bounds[level], bounds[level + 1]
        if method == "mean":
            blocks.append(stats.mu.expand(end - start, -1).clone())
        elif method == "random":
            blocks.append(random[start:end])
        elif method == "centroid":
            blocks.append(stats.mu + centroid[level])
        else:
            g = gti_g[start:end] - gti_g[start:end].mean(0)
            delta = frames.principal_map(g, stats.eigen[1]) if cfg.gti_placement == "principal" else g
            blocks.append(stats.mu + frames.rescale(delta, stats.centred_norm_mean))
    return torch.cat(blocks)


def _run_gti(cfg, model, tokenizer, item_texts, sids, levels, start_delta, pad_id, dtype, out_dir, progress):
    picked = gti.sample_items(item_texts, cfg.gti_max_items, cfg.seed)
    if len(picked) == 0:
        raise InputError("--init gti needs item text, but every item text is empty; use --init centroid")
    reps = gti.encode_items(model, tokenizer, [item_texts[i] for i in picked], cfg.gti_layer, dtype, pad_id, progress)
    targets, has_target = gti.token_targets(reps, sids[picked], levels)
    g, losses = gti.fit_projection(start_delta, targets, has_target, cfg.gti_steps, cfg.gti_lr, out_dir, progress,
                                   device=reps.device)
    return g, {"gti_items": int(len(picked)), "gti_tokens_with_targets": int(has_target.sum()),
               "gti_initial_loss": losses[0], "gti_final_loss": losses[-1], "gti_loss": gti.loss_curve(losses)}


def run(
    cfg: InitVocabConfig,
    base_dir: Path,
    item_texts: list[str],
    codebooks: list[np.ndarray],
    sids: np.ndarray,
    token_map: dict,
    out_dir: Path,
    progress: Progress = SILENT,
    sequences: list[list[int]] | None = None,
) -> dict:
    """Add SID tokens to the backbone in ``base_dir``, initialise them, write ``model/`` and ``sid_vocab.json``.
    With ``sequences`` (the users' training item sequences) the metrics tell whether the model starts able to
    tell users apart (:mod:`gencli.core.lm.geometry`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sids = np.asarray(sids)
    levels = check_inputs(cfg, item_texts, codebooks, sids, token_map)
    device = resolve_device(cfg.device)
    model, tokenizer = load_model(Path(base_dir), device, torch.float32)
    emb = model.get_input_embeddings()
    out_emb = model.get_output_embeddings()
    tied = out_emb is None or out_emb.weight.data_ptr() == emb.weight.data_ptr()
    d_model = emb.weight.shape[1]
    d = np.asarray(codebooks[0]).shape[1]
    if cfg.uses("centroid") and cfg.projection == "isometric" and d > d_model:
        raise InputError(f"--projection isometric needs the embedding dim ({d}) <= the model's hidden size "
                         f"({d_model}); use --projection pca or truncate, or embed with --dim {d_model}")

    ids = special_ids(tokenizer)
    if ids["pad_id"] is None:
        raise InputError(f"the model in {base_dir} has neither a pad nor an eos token; give a model whose tokenizer "
                         "defines eos_token")
    if tokenizer.pad_token_id is None:  # later steps batch with padding; eos is the usual stand-in
        tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = ids["pad_id"]

    n_base = min(len(tokenizer), emb.weight.shape[0])
    with progress.track("init-vocab: base statistics", total=None):
        stats_in = base_stats(emb.weight.detach(), n_base)
        stats_out = None if tied else base_stats(out_emb.weight.detach(), n_base)

    n_new = sum(levels)
    z = random_directions(n_new, d_model, cfg.seed)
    gti_g, extra = None, {}
    if cfg.uses("gti"):
        start_delta = (z @ stats_in.sampler.T) * cfg.eps ** 0.5
        gti_g, extra = _run_gti(cfg, model, tokenizer, item_texts, sids, levels, start_delta, ids["pad_id"],
                                resolve_dtype(cfg.dtype, device), out_dir, progress)

    rows_in = new_rows(cfg, stats_in, levels, z, codebooks, gti_g).float()
    rows_out = None if tied else new_rows(cfg, stats_out, levels, z, codebooks, gti_g).float()

    token_ids = add_sid_tokens(tokenizer, levels)
    first, last = token_ids[0][0], token_ids[-1][-1]
    with torch.random.fork_rng(devices=[]):  # resize initialises rows from the global RNG; we overwrite them
        model.resize_token_embeddings(max(emb.weight.shape[0], last + 1), mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[first:last + 1] = rows_in.to(device)
        if not tied:
            model.get_output_embeddings().weight[first:last + 1] = rows_out.to(device)

    with progress.track("init-vocab: save model", total=None):
        save_model(model, tokenizer, out_dir / artifacts.MODEL_DIR)
    sid_vocab = {"token_ids": token_ids, **ids, "base_vocab_size": first}
    (out_dir / artifacts.SID_VOCAB).write_text(json.dumps(sid_vocab) + "\n")

    with progress.track("init-vocab: geometry", total=None):
        item_tokens = np.stack([np.asarray(token_ids[lvl])[sids[:, lvl]] for lvl in range(len(levels))], axis=1)
        prompts = ([] if sequences is None else
                   geometry.sample_prompts(sequences, item_tokens, SFT_MAX_HISTORY, ids["bos_id"], cfg.seed))
        shape = geometry.report(model, token_ids, first, prompts, ids["pad_id"], cfg.seed)
    norms = rows_in.double().norm(dim=1)
    return {
        "method": cfg.init,
        "inits": cfg.level_inits(len(levels)),
        "projection": cfg.projection if cfg.uses("centroid") else None,
        "scale": cfg.scale if cfg.uses("centroid") else None,
        "gti_placement": cfg.gti_placement if cfg.uses("gti") else None,
        "base_rows_norm_mean": stats_in.norm_mean,
        "base_rows_mean_norm": float(stats_in.mu.norm()),
        "base_rows_centred_norm_mean": stats_in.centred_norm_mean,
        "new_rows_norm_mean": float(norms.mean()),
        "new_rows_norm_std": float(norms.std()) if n_new > 1 else 0.0,
        "new_rows_centred_norm_mean": float((rows_in.double() - stats_in.mu).norm(dim=1).mean()),
        "n_new_tokens": n_new,
        "tokens_per_level": levels,
        "base_vocab_size": first,
        "vocab_size": int(model.get_input_embeddings().weight.shape[0]),
        "tied": bool(tied),
        "d_model": int(d_model),
        "embedding_dim": int(d),
        "geometry": shape,
        **extra,
    }
