"""What ``gencli recommend`` reads and writes: workdir histories, ad-hoc queries, output files, the printed lists."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from gencli.errors import InputError

MAX_LISTED = 10


def workdir_recommender(ws, cfg, model_step: str):
    """A Recommender over the workdir's model step, quantize SIDs and ingest items (titles)."""
    from gencli.cli.inputs import item_codes, model_artifacts, ranker, trained_history
    from gencli.core.data import tables
    from gencli.core.device import resolve_device, resolve_dtype
    from gencli.core.infer.recommend import Recommender
    from gencli.core.lm.backbone import load_model
    from gencli.core.lm.prompt import item_token_ids, load_sid_vocab

    model_dir, vocab_path = model_artifacts(ws, model_step, "recommend")
    codes, _ = item_codes(ws, "recommend")
    items = tables.load_items(ws.input_dir("ingest", "recommend"))
    device = resolve_device(cfg.device)
    model, _ = load_model(model_dir, device, resolve_dtype(cfg.dtype, device))
    vocab = load_sid_vocab(vocab_path)
    return Recommender(model, vocab, items["item_id"].cast(pl.String).to_list(),
                       items["title"].cast(pl.String).to_list(), codes,
                       max_history=cfg.max_history or trained_history(ws, model_step), beams=cfg.beams,
                       batch_size=cfg.batch_size,
                       ranker=ranker(ws, model_step, "recommend", cfg.ranking, item_token_ids(codes, vocab)))


def workdir_histories(ws) -> tuple[list[str], list[list[int]]]:
    """Every user's full history (all kept events, train + valid + test, in time order), in user_idx order."""
    from gencli.core.data import tables

    events = tables.load_interactions(ws.input_dir("ingest", "recommend"))
    per_user = events.group_by("user_idx", maintain_order=True).agg(pl.col("user_id").first(), pl.col("item_idx"))
    per_user = per_user.sort("user_idx")
    return per_user["user_id"].cast(pl.String).to_list(), [list(h) for h in per_user["item_idx"].to_list()]


def long_frame(rec, user_ids: list, ranked, provenance: dict[str, Any] | None = None) -> pl.DataFrame:
    """user_id, rank (1 = best), item_id, score, title: one row per recommended item; then ``provenance`` (which
    model made it, and for a query its source and time) as constant columns."""
    rows: dict[str, list] = {"user_id": [], "rank": [], "item_id": [], "score": [], "title": []}
    for user, items, scores in zip(user_ids, ranked.items, ranked.scores, strict=True):
        for rank, item in enumerate(rec.to_recommendations(items, scores), start=1):
            rows["user_id"].append(user)
            rows["rank"].append(rank)
            rows["item_id"].append(item.item_id)
            rows["score"].append(item.score)
            rows["title"].append(item.title)
    frame = pl.DataFrame(rows, schema={"user_id": pl.String, "rank": pl.Int32, "item_id": pl.String,
                                       "score": pl.Float32, "title": pl.String})
    return frame.with_columns(pl.lit(v, dtype=pl.String).alias(k) for k, v in (provenance or {}).items())


def workdir_provenance(ws, model_step: str) -> dict[str, Any]:
    """``model`` (the id of the model step's files: the same as the bundle exported from it) and ``run`` (the
    workdir)."""
    from gencli.cli.inputs import step_model_id

    return {"model": step_model_id(ws, model_step), "run": ws.root.resolve().name}


def bundle_provenance(meta: dict[str, Any]) -> dict[str, Any]:
    """``model`` and ``run`` of a bundle, from its gencli.json (the run is the workdir it was exported from)."""
    from gencli.core.artifacts import bundle_model_id

    source = meta.get("source") if isinstance(meta.get("source"), dict) else {}
    return {"model": bundle_model_id(meta),
            "run": Path(str(source["workdir"])).name if source.get("workdir") else None}


def _created() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


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


def adhoc(cfg, workdir, bundle, users, user_file, history, from_stdin, output, json_mode, jsonl_shape="user") -> None:
    """Answer a query without recording a step: resolve the histories, decode, write or print."""
    from gencli.cli.common import apply_threads, open_workspace, quiet_libraries
    from gencli.ui.progress import make_progress

    quiet_libraries()
    if output is not None and output != "-" and Path(output).suffix.lower() not in (".parquet", ".csv", ".jsonl"):
        raise InputError(f"--output {output}: use a .parquet, .csv or .jsonl file, or '-' for JSON Lines on stdout")
    ws = None
    if bundle is None:
        ws = _workdir(open_workspace(workdir))
    # parse the cheap inputs before loading a model
    queries: list[tuple[Any, list[str] | None]]
    if from_stdin:
        queries = read_queries(sys.stdin, bundle is None or workdir is not None or _carries_users(bundle))
    elif history is not None:
        queries = [(None, [i.strip() for i in history.split(",") if i.strip()])]
    else:
        wanted = [*users, *(_user_ids_from_file(user_file) if user_file else [])]
        queries = [(u, None) for u in wanted] if wanted else None
    if bundle is not None and workdir is not None and (queries is None or any(h is None for _, h in queries)):
        ws = _workdir(open_workspace(workdir))  # the bundle's model, the workdir's users and histories
    apply_threads()
    by_user_ids: dict[str, list[str]] = {}  # --bundle with --workdir: histories as ids, resolved in the bundle
    if ws is not None and bundle is None:
        from gencli.cli.inputs import pick_model_step

        step = pick_model_step(ws, cfg.model_step, "recommend")
        rec = workdir_recommender(ws, cfg, step)
        provenance = workdir_provenance(ws, step)
        user_ids, known = workdir_histories(ws)
    elif ws is not None:
        from gencli.core.data import tables
        from gencli.core.infer.recommend import Recommender

        rec = Recommender.load(bundle, cfg.device, cfg.dtype)
        rec.batch_size = cfg.batch_size
        if cfg.ranking == "model" and rec.ranker is not None:
            rec.ranker = dataclasses.replace(rec.ranker, blends=None)
        if cfg.max_history:
            rec.max_history = cfg.max_history
        provenance = bundle_provenance(rec.metadata)
        item_ids = tables.load_items(ws.input_dir("ingest", "recommend"))["item_id"].cast(pl.String).to_list()
        user_ids, known = workdir_histories(ws)
        by_user_ids = {u: [item_ids[i] for i in h] for u, h in zip(user_ids, known, strict=True)}
    else:
        from gencli.core.infer.bundle import read_users
        from gencli.core.infer.recommend import Recommender

        rec = Recommender.load(bundle, cfg.device, cfg.dtype)
        rec.batch_size = cfg.batch_size
        if cfg.max_history:
            rec.max_history = cfg.max_history
        provenance = bundle_provenance(rec.metadata)
        carried = read_users(bundle, len(rec))
        if carried is None and any(h is None for _, h in queries or [(None, None)]):
            raise InputError(f"bundle {bundle} carries no user histories (exported with --no-users, or by an earlier "
                             "gencli): give --history or --stdin with a \"history\", or export it again")
        user_ids, known = carried or ([], [])
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
    ranked = rec.rank(histories, k=cfg.k, beams=cfg.beams, exclude_seen=cfg.exclude_seen,
                      prune=cfg.stamp if cfg.stamp.sap else None, progress=make_progress(json_mode))
    provenance = {**provenance, "created": _created()}
    user_ids = [None if u is None else str(u) for u, _ in queries]
    answers = [{"user_id": u,
                "items": [{**r._asdict(), "rank": n} for n, r in enumerate(rec.to_recommendations(items, scores), 1)],
                "skipped": s, "history_used": len(h)}
               for u, items, scores, s, h in zip(user_ids, ranked.items, ranked.scores, skipped, histories, strict=True)]
    if unknown_all:
        _warn(f"skipped {len(unknown_all)} distinct history item id(s) not in the catalog "
              f"({sum(map(len, skipped))} occurrences) "
              f"({', '.join(unknown_all[:MAX_LISTED])}); --strict makes this an error")
    blind = sum(1 for a in answers if a["skipped"] and not a["history_used"])
    if blind:
        _warn(f"{blind} user(s) had only unknown history ids: their lists are the model's unconditional top "
              f"{cfg.k} (history_used 0 in the answer)")
    frame = long_frame(rec, user_ids, ranked, provenance) if output is not None else None
    if output == "-":
        sys.stdout.write("".join(_jsonl(answers, frame, jsonl_shape, provenance)))
        sys.stdout.flush()
        return
    if output is not None:
        _write(Path(output), _jsonl(answers, frame, jsonl_shape, provenance), frame)
    _report(answers, output, rec, histories, json_mode, provenance)


def _workdir(ws):
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
            frame.write_csv(tmp)
        else:
            tmp.write_text("".join(lines), encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _warn(message: str) -> None:

    from gencli.ui.output import console

    console(stderr=True).print(f"[yellow]warning[/yellow]: {printable(message)}", soft_wrap=True)


def _report(answers: list[dict], output, rec, histories: list[list[int]], json_mode: bool,
            provenance: dict[str, Any]) -> None:
    if json_mode:
        from gencli.ui.output import emit_json

        payload: dict[str, Any] = {"status": "done", "users": len(answers),
                                   "skipped_ids": sum(len(a["skipped"]) for a in answers),
                                   "unconditional_users": sum(1 for a in answers if a["skipped"] and
                                                              not a["history_used"]), **provenance}
        if output is not None:
            payload["output"] = str(output)
        else:
            payload["recommendations"] = answers
        emit_json(payload)
        return
    from gencli.ui.output import console

    c = console()
    if output is not None:
        c.print(f"[green]✓[/green] recommendations for {len(answers)} user(s) → {output}")
        return
    for answer, history in zip(answers, histories, strict=True):
        print_user(c, answer["user_id"], [rec.titles[i] for i in history], answer["items"])


def printable(text: str) -> str:
    """Catalog text safe for a terminal: rich markup escaped, control characters (escape sequences) shown as
    ``\\x1b`` rather than sent to the terminal."""
    from rich.markup import escape

    return escape("".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text))


def print_user(c, user_id, history_titles: list[str], items: list[dict], last: int = 5) -> None:
    """One user's recent history and top items, as a small rich table."""
    from rich.table import Table

    shown = history_titles[-last:]
    more = len(history_titles) - len(shown)
    who = f"user {user_id}" if user_id is not None else "ad-hoc history"
    recent = "; ".join(printable(t) for t in shown) or "(empty: the model's unconditional top items)"
    c.print(f"\n[bold]{printable(who)}[/bold] — recent history{f' (+{more} earlier)' if more else ''}: {recent}",
            soft_wrap=True)
    table = Table(show_header=True, header_style="bold")
    table.add_column("#", justify="right")
    table.add_column("item_id", no_wrap=True)
    table.add_column("title")
    table.add_column("score", justify="right")
    for rank, item in enumerate(items, start=1):
        table.add_row(str(rank), printable(item["item_id"]), printable(item["title"]), f"{item['score']:.3f}")
    c.print(table)


def show_examples(ws, n_users: int = 3, top: int = 5) -> None:
    """After `gencli run`: a few users' recent history and their top items, so a newcomer sees the output."""
    from gencli.core.data import tables
    from gencli.ui.output import console

    frame = pl.read_parquet(ws.step_dir("recommend") / "recommendations.parquet")
    ingest = ws.input_dir("ingest", "run")
    titles = tables.load_items(ingest)["title"].cast(pl.String).to_list()
    user_ids, histories = workdir_histories(ws)
    c = console()
    c.print(f"\n[bold]recommendations[/bold] (top {top} of {len(user_ids)} users; all in "
            f"{ws.step_dir('recommend') / 'recommendations.parquet'})")
    picks = np.linspace(0, len(user_ids) - 1, num=min(n_users, len(user_ids))).astype(int).tolist()
    for i in dict.fromkeys(picks):
        rows = frame.filter((pl.col("user_id") == user_ids[i]) & (pl.col("rank") <= top)).sort("rank")
        print_user(c, user_ids[i], [titles[j] for j in histories[i]], rows.select("item_id", "title", "score").to_dicts())
