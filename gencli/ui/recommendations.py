"""Recommendations on a terminal: a user's recent history and top items, the answers of a query, a run's examples."""

from __future__ import annotations

from typing import Any


def printable(text: str) -> str:
    """Catalog text safe for a terminal: rich markup escaped, control characters (escape sequences) shown as
    ``\\x1b`` rather than sent to the terminal."""
    from rich.markup import escape

    return escape("".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text))


def warn(message: str) -> None:
    from gencli.ui.output import console, log_pipe

    with log_pipe():
        console(stderr=True).print(f"[yellow]warning[/yellow]: {printable(message)}", soft_wrap=True)


EMPTY = {True: "(empty: what has been popular lately, the no-history prior)",
         False: "(empty: the model's unconditional top, with no popularity prior to go on)", None: "(empty)"}
"""An empty history's line, by the answer's ``fallback`` (None: not known)."""


def print_user(c, user_id, history_titles: list[str], items: list[dict], last: int = 5,
               fallback: bool | None = None) -> None:
    """One user's recent history (one line, cut at the terminal's width) and top items (rank, item_id, title, score);
    ``fallback``: whether an empty history was answered by the no-history prior (:data:`EMPTY` says which list)."""
    from rich.table import Table

    shown = history_titles[-last:]
    more = len(history_titles) - len(shown)
    who = f"user {user_id}" if user_id is not None else "ad-hoc history"
    recent = "; ".join(printable(t) for t in shown) or EMPTY[fallback]
    c.print(f"[bold]{printable(who)}[/bold] — recent history{f' (+{more} earlier)' if more else ''}: {recent}",
            no_wrap=True, overflow="ellipsis")
    table = Table(box=None, show_header=False, padding=(0, 1), pad_edge=True)
    table.add_column("#", justify="right")
    table.add_column("item_id", no_wrap=True)
    table.add_column("title")
    table.add_column("score", justify="right")
    for rank, item in enumerate(items, start=1):
        table.add_row(str(rank), printable(item["item_id"]), printable(item["title"]), f"{item['score']:.3f}")
    c.print(table)


def print_answers(result, json_mode: bool) -> None:
    """What ``gencli recommend`` prints for a query (:class:`gencli.flow.query.Answers`)."""
    answers = result.answers
    if json_mode:
        from gencli.ui.output import emit_json

        payload: dict[str, Any] = {"status": "done", "users": len(answers),
                                   "skipped_ids": sum(len(a["skipped"]) for a in answers),
                                   "unconditional_users": sum(1 for a in answers if a["skipped"] and
                                                              not a["history_used"]), **result.provenance}
        if result.output is not None:
            payload["output"] = str(result.output)
        else:
            payload["recommendations"] = answers
        emit_json(payload)
        return
    from gencli.ui.output import console

    c = console()
    if result.output is not None:
        c.print(f"[green]✓[/green] recommendations for {len(answers)} user(s) → {result.output}")
        return
    for answer, history in zip(answers, result.histories, strict=True):
        c.print("")
        print_user(c, answer["user_id"], [result.titles[i] for i in history], answer["items"],
                   fallback=answer.get("fallback"))


def show_examples(shown: Any) -> None:
    """After `gencli run`: a few users' recent history and their top items (:func:`gencli.flow.query.examples`), so
    a newcomer sees the output."""
    from gencli.ui.output import console

    c = console()
    where = printable(shown.file)  # in the workdir `gencli run` has just named
    c.print(f"\n[bold]recommendations[/bold] (every user's top {shown.k}: {where}), {len(shown.users)} of them:",
            soft_wrap=True)
    for user in shown.users:
        print_user(c, user["user_id"], user["history"], user["items"], fallback=user.get("fallback"))
