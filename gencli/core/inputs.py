"""What a step reads, resolved before it runs: the folders of its declared upstream steps and its external inputs.

The workspace executor builds an :class:`Inputs` from the registry's declaration (:mod:`gencli.steps`) and hands
it to the step's ``run(cfg, inputs, out, progress)``. A step reads upstream artifacts only through it, so it cannot
read what it did not declare: asking for another step's folder raises :class:`UndeclaredInput`. The loaders below
are the one way each shared artifact is read (items, splits, SIDs, vectors, a model step's files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gencli.errors import ArtifactError


class UndeclaredInput(LookupError):
    """A step asked for an upstream folder its registry entry does not declare (a bug in that step)."""


@dataclass(frozen=True)
class Inputs:
    """The resolved inputs of one step run."""

    step: str
    folders: dict[str, Path]
    """Upstream step -> its finished folder (only the declared ones)."""
    records: dict[str, dict[str, Any]]
    """Upstream step -> its ``step.json`` (params, outputs with hashes, metrics)."""
    model_step: str | None = None
    """The model step it reads (picked from ``auto``), None for steps that read none."""
    model_steps: tuple[str, ...] = ()
    """Every model step it reads (probe: each finished one; else the one above)."""
    external: dict[str, Any] = field(default_factory=dict)
    """What it reads outside the workdir, resolved from its config (:mod:`gencli.workspace.external`)."""
    resume: bool = False
    """The staging folder holds an interrupted attempt with the same options and inputs: continue it."""

    def dir(self, step: str) -> Path:
        if step not in self.folders:
            raise UndeclaredInput(f"step '{self.step}' read the output of '{step}', which its registry entry in "
                                  f"gencli/steps.py does not declare (it declares {', '.join(self.folders) or 'none'})")
        return self.folders[step]

    def record(self, step: str) -> dict[str, Any]:
        self.dir(step)
        return self.records[step]

    def done(self, step: str) -> bool:
        """Whether an optional input (the registry's ``optional``) had run."""
        return step in self.folders

    # ---- the shared artifacts ------------------------------------------------------------------
    def items(self):
        from gencli.core.data import tables

        return tables.load_items(self.dir("ingest"))

    def split(self, name: str):
        from gencli.core.data import tables

        return tables.load_split(self.dir("ingest"), name)

    def interactions(self):
        from gencli.core.data import tables

        return tables.load_interactions(self.dir("ingest"))

    def codes(self):
        """SID codes [n_items, L+1] in item order and the token map, from quantize."""
        from gencli.core.sid import store

        folder = self.dir("quantize")
        return store.load_item_codes(folder), store.load_token_map(folder)

    def codebooks(self):
        from gencli.core.sid import store

        return store.load_codebook_list(self.dir("quantize"))

    def embeddings(self, mmap: bool = False):
        from gencli.core.sid import embed

        return embed.load_embeddings(self.dir("embed"), mmap=mmap)

    def lexical(self):
        """embed's BM25 rows of the item texts (CSR), or None for a workdir embedded before them."""
        from gencli.core.sid import embed

        folder = self.dir("embed")
        return embed.load_lexical(folder, int(embed.load_embeddings(folder, mmap=True).shape[0]))

    def model(self, step: str | None = None) -> tuple[Path, Path]:
        """(model folder, sid_vocab.json) of a model step (default: the one this step reads)."""
        return model_files(self.dir(step or self.model_step), step or self.model_step)

    def trained_history(self, step: str | None = None) -> int:
        """The prompt length sft trained with, so decoding sees prompts like the ones the model learnt from."""
        return trained_history(self.record(step or self.model_step))

    def model_id(self, step: str | None = None) -> str:
        """:func:`gencli.core.artifacts.model_id` of a model step, from its ``step.json`` outputs."""
        from gencli.core.artifacts import model_id

        step = step or self.model_step
        return model_id(step, {o["path"]: o["sha256"] for o in self.record(step).get("outputs", [])})

    def ranker(self, ranking: str, item_tokens):
        """The content scorer over embed's vectors and, with ``ranking`` auto, the blends the model step fitted
        (sft's blend.json; none: the model alone)."""
        return ranker(self.embeddings(), self.dir(self.model_step), self.model_step, ranking, item_tokens,
                      self.lexical())


def model_files(folder: Path, step: str) -> tuple[Path, Path]:
    """(model folder, sid_vocab.json) inside a model step's folder, or an error naming the step to rerun."""
    from gencli.core import artifacts

    model_dir, vocab = folder / artifacts.MODEL_DIR, folder / artifacts.SID_VOCAB
    for p in (model_dir / "config.json", vocab):
        if not p.exists():
            raise ArtifactError(f"{p} is missing, so '{step}' is incomplete; rerun `gencli {step} --force`")
    from gencli.core.infer.model_check import check_step_model

    check_step_model(model_dir, vocab)  # as a bundle's model: its config and weights agree before any step loads it
    return model_dir, vocab


def trained_history(record: dict[str, Any]) -> int:
    """The prompt length a model step trained with, from its ``step.json``: the ``max_history`` it measured in its
    metrics (rl: the one its start model was trained with), else the one its params hold (sft's option; the
    default in cpt's), else the sft default (a model no training step recorded one for: init-vocab's)."""
    from gencli.config import SFT_MAX_HISTORY

    for block in ("metrics", "params"):
        value = (record.get(block) or {}).get("max_history")
        if value is not None:
            return int(value)
    return SFT_MAX_HISTORY


def ranker(vectors, model_folder: Path, model_step: str, ranking: str, item_tokens, lexical=None):
    """The :class:`~gencli.core.infer.blend.Ranker` of a model folder: its blend.json's text mix and repeat share
    always, its blends when ``ranking`` is auto."""
    from gencli.core import artifacts
    from gencli.core.infer.blendfile import BlendFile, ranker_of
    from gencli.core.infer.prior import read_item_prior

    if vectors.shape[0] != len(item_tokens):
        raise ArtifactError(f"embed has vectors for {vectors.shape[0]} items but quantize has SIDs for "
                            f"{len(item_tokens)}; rerun `gencli embed` and `gencli quantize`")
    record = None
    path = model_folder / artifacts.BLEND
    if path.is_file():
        try:
            record = BlendFile.read(path)
        except (ValueError, UnicodeDecodeError, TypeError, OverflowError) as exc:
            raise ArtifactError(f"{path} is damaged ({str(exc)[:200]}); rerun `gencli {model_step} --force`") from None
    try:
        counts, prior = read_item_prior(model_folder / artifacts.ITEM_PRIOR, len(item_tokens))
    except ValueError as exc:
        raise ArtifactError(f"{model_folder}: {exc}; rerun `gencli {model_step} --force`") from None
    return ranker_of(record, vectors, item_tokens, lexical, counts, prior, blends=ranking == "auto")
