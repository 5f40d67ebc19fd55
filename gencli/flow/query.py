"""Ad-hoc recommendation queries: histories from a workdir, a bundle, a list or JSON Lines -> ranked answers.

``gencli recommend`` with a selector (--user, --history, --stdin, --bundle, --output) calls :func:`answer`: it
reads the workdir or the bundle, records nothing, and returns the answers (and writes --output); the CLI prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gencli.errors import InputError

if TYPE_CHECKING:
    import polars as pl

MAX_LISTED = 10
OUTPUT_SUFFIXES = (".parquet", ".csv", ".jsonl")


@dataclass
class Query:
    """What to answer: users of the workdir or bundle, or given histories (item ids)."""

    workdir: Path | None = None
    bundle: Path | None = None
    users: list[str] = field(default_factory=list)
    user_file: Path | None = None
    history: str | None = None
    stdin: bool = False
    output: str | None = None
    jsonl_shape: str = "user"


@dataclass
class Answers:
    answers: list[dict[str, Any]]
    """Per query: user_id, items (rank, item_id, score, title), skipped ids, history_used."""
    histories: list[list[int]]
    titles: list[str]
    provenance: dict[str, Any]
    warnings: list[str]
    output: str | None = None
    lines: list[str] | None = None
    """With ``--output -``: the JSON Lines to stream to stdout."""


def _stdin_lines(stream):
    """Numbered lines; a stream that cannot be decoded is bad input naming the line, not a traceback."""
    number = 0
    try:
        for number, line in enumerate(stream, start=1):
            yield number, line
    except UnicodeDecodeError:
        raise InputError(f"--stdin: line {number + 1} is not UTF-8 text; send UTF-8 JSON Lines") from None


def read_queries(stream, have_workdir_users: bool) -> list[tuple[Any, list[str] | None]]:
    """JSON Lines {"user_id": ..., "history": [item ids]} -> [(user_id, history or None)]; every bad line listed."""
    queries, problems = [], []
    for number, line in _stdin_lines(stream):
        if not line.strip():
            continue
        try:
            line.encode("utf-8")  # undecodable bytes arrive as surrogates: they would be written back as bad JSON
            obj = json.loads(line)
        except UnicodeEncodeError:
            problems.append(f"line {number}: not UTF-8 text")
            continue
        except RecursionError:
            problems.append(f"line {number}: nested too deeply to be a query")
            continue
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: not JSON ({exc.msg})")
            continue
        if not isinstance(obj, dict):
            problems.append(f"line {number}: expected an object like {{\"user_id\": \"u1\", \"history\": [\"i1\"]}}")
            continue
        history = obj.get("history")
        if history is None and not (have_workdir_users and obj.get("user_id") is not None):
            problems.append(f"line {number}: no \"history\" list" +
                            ("" if have_workdir_users else " (a bundle knows no users, so every line needs one)"))
            continue
        if history is not None and not (isinstance(history, list) and
                                        all(isinstance(i, (str, int)) and not isinstance(i, bool) for i in history)):
            problems.append(f"line {number}: \"history\" must be a list of item ids (strings)")
            continue
        queries.append((obj.get("user_id"), None if history is None else [str(i) for i in history]))
    if problems:
        shown = "\n".join(f"  - {p}" for p in problems[:MAX_LISTED])
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise InputError(f"--stdin: {len(problems)} bad line(s):\n{shown}{more}")
    return queries


def _user_ids_from_file(path: Path) -> list[str]:
    from gencli.fileio import check_readable

    check_readable(path, "--user-file")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"--user-file {path} does not exist; check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--user-file {path} cannot be read as text ({exc}); give one user id per line") from None
    ids = [line.strip() for line in text.splitlines() if line.strip()]
    if not ids:
        raise InputError(f"--user-file {path} holds no user ids; give one per line")
    return ids


def answer(cfg, query: Query, progress=None) -> Answers:
    """Resolve the histories, decode, write ``query.output`` (not '-'): a RecommendConfig's settings apply."""
    output = query.output
    if output is not None and output != "-" and Path(output).suffix.lower() not in OUTPUT_SUFFIXES:
        raise InputError(f"--output {output}: use a .parquet, .csv or .jsonl file, or '-' for JSON Lines on stdout")
    if output is not None and output != "-":
        from gencli.workspace.places import check_output

        check_output(output)  # before any model is read: a query writes into no workdir and no bundle
    ws = None
    if query.bundle is None:
        from gencli.workspace import default_workdir

        ws = _workdir(query.workdir or default_workdir())
    # parse the cheap inputs before loading a model
    queries: list[tuple[Any, list[str] | None]] | None
    if query.stdin:
        queries = read_queries(sys.stdin, query.bundle is None or query.workdir is not None
                               or _carries_users(query.bundle))
    elif query.history is not None:
        queries = [(None, [i.strip() for i in query.history.split(",") if i.strip()])]
    else:
        wanted = [*query.users, *(_user_ids_from_file(query.user_file) if query.user_file else [])]
        queries = [(u, None) for u in wanted] if wanted else None
    if query.bundle is not None and query.workdir is not None and (queries is None or
                                                                   any(h is None for _, h in queries)):
        ws = _workdir(query.workdir)  # the bundle's model, the workdir's users and histories
    from gencli.threads import QUERY_THREADS
    from gencli.workspace.executor import apply_threads, quiet_libraries

    quiet_libraries()
    apply_threads(QUERY_THREADS)
    rec, provenance, user_ids, known, by_user_ids = _open(cfg, ws, query, queries)
    by_user = dict(zip(user_ids, known, strict=True))
    if queries is None:  # every user (--output without a selector)
        queries = [(u, None) for u in user_ids]
    missing = [str(u) for u, h in queries if h is None and str(u) not in by_user]
    if missing:
        where = "workdir" if ws is not None else "bundle"
        raise InputError(f"{len(missing)} user id(s) are not in the {where}: {', '.join(missing[:MAX_LISTED])}"
                         " (for a new user pass --history, or a \"history\" in --stdin)")
    histories, skipped = [], []
    for user, ids in queries:
        if ids is None and by_user_ids:
            ids = by_user_ids[str(user)]  # the workdir's catalog: ids the bundle does not know are skipped
        if ids is None:
            histories.append(by_user[str(user)])
            skipped.append([])
        else:
            idx, unknown = rec.resolve(ids)
            histories.append(idx)
            skipped.append(unknown)
    unknown_all = sorted({u for s in skipped for u in s})
    if unknown_all and cfg.strict:
        raise InputError(f"--strict: {len(unknown_all)} history item id(s) are not in the catalog: "
                         f"{', '.join(unknown_all[:MAX_LISTED])}")
    from gencli.core.progress import SILENT

    ranked = rec.rank(histories, k=cfg.k, beams=cfg.beams, exclude_seen=cfg.exclude_seen,
                      prune=cfg.stamp if cfg.stamp.sap else None, progress=progress or SILENT)
    provenance = {**provenance, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    ids = [None if u is None else str(u) for u, _ in queries]
    answers = [{"user_id": u,
                "items": [{**r._asdict(), "rank": n} for n, r in enumerate(rec.to_recommendations(items, scores), 1)],
                "skipped": s, "history_used": len(h), "fallback": bool(rec.falls_back(h))}
               for u, items, scores, s, h in zip(ids, ranked.items, ranked.scores, skipped, histories, strict=True)]
    warnings = []
    if unknown_all:
        warnings.append(f"skipped {len(unknown_all)} distinct history item id(s) not in the catalog "
                        f"({sum(map(len, skipped))} occurrences) "
                        f"({', '.join(unknown_all[:MAX_LISTED])}); --strict makes this an error")
    blind = [a for a in answers if a["skipped"] and not a["history_used"]]
    if blind:
        what = ("the no-history prior, what has been popular lately (fallback true in the answer)"
                if blind[0]["fallback"] else f"the model's unconditional top {cfg.k} (history_used 0 in the answer)")
        warnings.append(f"{len(blind)} user(s) had only unknown history ids: their lists are {what}")
    result = Answers(answers, histories, rec.titles, provenance, warnings, output)
    if output is not None:
        from gencli.core.infer.workdir import long_frame

        frame = long_frame(rec, ids, ranked, provenance)
        lines = _jsonl(answers, frame, query.jsonl_shape, provenance)
        if output == "-":
            result.lines = lines
        else:
            _write(Path(output), lines, frame)
    return result


def _open(cfg, ws, query: Query, queries):
    """(recommender, provenance, user ids, their histories as item indices, histories as ids or {}); the users of
    the workdir or bundle are read only when a query names one (or there is none: every user)."""
    from gencli.core.infer.recommend import Recommender

    users = queries is None or any(h is None for _, h in queries)
    if ws is not None and query.bundle is None:
        from gencli.core.infer import workdir
        from gencli.steps import STEPS
        from gencli.workspace.executor import read_inputs

        inputs = read_inputs(ws, STEPS["recommend"], cfg)
        user_ids, known = workdir.histories(inputs) if users else ([], [])
        return workdir.recommender(inputs, cfg), workdir.provenance(inputs), user_ids, known, {}
    rec = Recommender.load(query.bundle, cfg.device, cfg.dtype, threads=0)  # threads: apply_threads set them
    rec.batch_size = cfg.batch_size
    if cfg.max_history:
        rec.max_history = cfg.max_history
    if cfg.ranking == "model" and rec.ranker is not None:
        rec.ranker = dataclasses.replace(rec.ranker, blends=None)
    provenance = bundle_provenance(rec.metadata)
    if ws is not None:
        import polars as pl

        from gencli.core.infer import workdir
        from gencli.flow.export import recommend_inputs

        inputs = recommend_inputs(ws)
        item_ids = inputs.items()["item_id"].cast(pl.String).to_list()
        user_ids, known = workdir.histories(inputs)
        by_ids = {u: [item_ids[i] for i in h] for u, h in zip(user_ids, known, strict=True)}
        return rec, provenance, user_ids, known, by_ids
    if not users:
        return rec, provenance, [], [], {}
    from gencli.core.infer.bundle import read_users

    carried = read_users(query.bundle, len(rec))
    if carried is None:
        raise InputError(f"bundle {query.bundle} carries no user histories (exported with --no-users, or by an "
                         "earlier gencli): give --history or --stdin with a \"history\", or export it again")
    user_ids, known = carried or ([], [])
    return rec, provenance, user_ids, known, {}


def bundle_provenance(meta: dict[str, Any]) -> dict[str, Any]:
    """``model`` and ``run`` of a bundle, from its gencli.json (the run is the workdir it was exported from, the
    absolute path export recorded)."""
    from gencli.core.artifacts import bundle_model_id

    source = meta.get("source") if isinstance(meta.get("source"), dict) else {}
    return {"model": bundle_model_id(meta), "run": str(source["workdir"]) if source.get("workdir") else None}


def _workdir(folder):
    """The workspace of a workdir query (a bundle query imports none of the workspace's code)."""
    from gencli.workspace import Workspace

    ws = Workspace(folder)
    if not (ws.root / "manifest.json").exists():
        raise InputError(f"workdir {ws.root} holds no finished steps; run `gencli run sample_data/pipeline.toml` "
                         "or point --workdir (or --bundle) at a trained model")
    return ws


def _carries_users(bundle) -> bool:
    """Whether a bundle has users.parquet (cheap: before any model or checksum is read)."""
    from gencli.core.infer.bundle import USERS, follow_pointer

    try:
        return (follow_pointer(Path(bundle)) / USERS).is_file()
    except InputError:
        return False


def _jsonl(answers: list[dict], frame: pl.DataFrame, shape: str, provenance: dict[str, Any]) -> list[str]:
    """JSON Lines: one object per user (``user``: its items in a list, then which model answered and when), or one
    per recommended item (``item``: the columns of the .parquet/.csv table)."""
    if shape == "item":
        return [json.dumps(row) + "\n" for row in frame.iter_rows(named=True)]
    return [json.dumps({**a, **provenance}) + "\n" for a in answers]


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""What a spreadsheet reads as the start of a formula in a CSV cell (OWASP's list)."""


def csv_safe(frame: pl.DataFrame) -> pl.DataFrame:
    """Text cells that a spreadsheet would run as a formula (``=HYPERLINK(...)`` as a title or a user id) prefixed
    with ``'``, which spreadsheets show as text; numbers and other text are unchanged."""
    import polars as pl

    risky = "^[" + "".join("\\" + c if c in "-" else c for c in FORMULA_START) + "]"
    return frame.with_columns(
        pl.when(pl.col(name).str.contains(risky)).then("'" + pl.col(name)).otherwise(pl.col(name)).alias(name)
        for name, dtype in frame.schema.items() if dtype == pl.String)


def _write(path: Path, lines: list[str], frame: pl.DataFrame) -> None:
    """The file by extension, written to a temporary sibling and renamed (no half-written file on failure)."""
    if path.is_dir():
        raise InputError(f"--output {path} is a folder; give a file name ending in .parquet, .csv or .jsonl")
    if not path.parent.exists():
        raise InputError(f"--output {path}: folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            frame.write_parquet(tmp)
        elif suffix == ".csv":
            csv_safe(frame).write_csv(tmp)
        else:
            tmp.write_text("".join(lines), encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Examples:
    """A few users' lists from the recommend step's file, for display after ``gencli run``."""

    file: str
    """The file, relative to the workdir (``recommend/recommendations.parquet``)."""
    k: int
    """Items per user in the file."""
    users: list[dict[str, Any]]
    """Per user: ``user_id``, ``history`` (titles, oldest first), ``items`` (item_id, title, score; best first)."""


def examples(workdir: Path, n_users: int = 3, top: int = 5) -> Examples | None:
    """``n_users`` users spread over the workdir's users (first, middle, last) with their ``top`` items; None when
    the recommend step's lists are not up to date."""
    import numpy as np
    import polars as pl

    from gencli.core.infer import workdir as rec_workdir
    from gencli.flow.export import recommend_inputs
    from gencli.workspace import Workspace

    ws = Workspace(workdir)
    if ws.freshness("recommend") != "done":
        return None
    path = ws.step_dir("recommend") / rec_workdir.RECOMMENDATIONS
    frame = pl.read_parquet(path)
    inputs = recommend_inputs(ws)
    titles = inputs.items()["title"].cast(pl.String).to_list()
    user_ids, histories = rec_workdir.histories(inputs)
    picks = np.linspace(0, len(user_ids) - 1, num=min(n_users, len(user_ids))).astype(int).tolist()
    users = []
    for i in dict.fromkeys(picks):
        rows = frame.filter((pl.col("user_id") == user_ids[i]) & (pl.col("rank") <= top)).sort("rank")
        users.append({"user_id": user_ids[i], "history": [titles[j] for j in histories[i]],
                      "items": rows.select("item_id", "title", "score").to_dicts()})
    return Examples(f"{path.parent.name}/{path.name}", int(frame["rank"].max() if frame.height else 0), users)
