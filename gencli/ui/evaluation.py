"""One labelled table per evaluation (eval, cold-eval): the served policy first, the other policy beside it.

A ranking step's metrics hold the blocks of its ``--exclude-seen/--include-seen`` policy at the top (``overall``,
``head``, ..., the baselines) and, with ``--both-policies`` (the default), the other policy's under
``other_policy``. The table leads with the served policy (seen items masked, what ``gencli recommend`` serves):
every Recall@K and NDCG@K of gencli's ranking, its popularity buckets and the baselines on the same users, then
Recall and NDCG at the headline K of the other policy. Everything else (ratios, coverage, the rest of the other
policy) is in ``--verbose`` and the step's ``metrics.json``.
"""

from __future__ import annotations

from typing import Any

HEADLINE_K = 10
"""The cut-off README, ``status`` and the other policy's columns lead with (the largest K when 10 is not asked)."""

SERVED, SEEN_RANKED = "served", "seen ranked"
BUCKETS = ("head", "torso", "tail")
BASELINES = (("model alone", "model_only"), ("content", "content_baseline"), ("popularity", "popularity_baseline"))


def policies(metrics: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, blocks) of each seen-item policy a ranking step scored, the served one first."""
    mine = (SERVED if metrics.get("exclude_seen") else SEEN_RANKED, metrics)
    other = metrics.get("other_policy")
    if not isinstance(other, dict):
        return [mine]
    theirs = (SERVED if other.get("exclude_seen") else SEEN_RANKED, other)
    return [mine, theirs] if mine[0] == SERVED else [theirs, mine]


def rows(blocks: dict[str, Any], detail: bool = True) -> list[tuple[str, tuple[str, ...]]]:
    """(label, path to a block) of the table's rows: gencli's ranking, its popularity buckets (a bucket holding every
    user repeats the overall row and is left out), then the baselines. A breakdown is one more list of paths here."""
    overall = blocks.get("overall") or {}
    out: list[tuple[str, tuple[str, ...]]] = [("gencli", ("overall",))]
    out += [(f"  {b}", (b,)) for b in BUCKETS if isinstance(blocks.get(b), dict)
            and blocks[b].get("users") != overall.get("users")]
    out += [(label, (key,)) for label, key in BASELINES if isinstance(blocks.get(key), dict)]
    lengths = (blocks.get("by_history") or {}).get("gencli") or {}
    if detail and len(lengths) > 1:  # gencli by the length of the users' histories (one bucket would repeat the overall row)
        out += [(f"  history {label}", ("by_history", "gencli", label)) for label in lengths]
    return out


def block(blocks: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    for key in path:
        blocks = blocks.get(key) if isinstance(blocks, dict) else None
    return blocks if isinstance(blocks, dict) else None


def headline_k(ks: list[int]) -> int:
    return HEADLINE_K if HEADLINE_K in ks or not ks else max(ks)


def _ks(metrics: dict[str, Any]) -> list[int]:
    if isinstance(metrics.get("k"), list):
        return [int(k) for k in metrics["k"]]
    overall = metrics.get("overall") or {}
    return sorted({int(key.split("@")[1]) for key in overall if key.startswith("recall@")})


def _cell(b: dict[str, Any] | None, key: str) -> str:
    value = None if b is None else b.get(key)
    return f"{value:.4f}" if isinstance(value, (int, float)) else ""


def evaluation_table(step: str, metrics: dict[str, Any], where: str | None = None, legend: bool = True,
                     detail: bool = True):
    """One ranking step's result: its table, then what the columns mean (``legend``; ``gencli run`` says it once),
    which ranking the first policy used and where every metric is (``where``: the step's folder). ``detail``: gencli
    by history length and the no-history answers (``gencli eval``; ``gencli run`` keeps to one screen)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    ks = _ks(metrics)
    views = policies(metrics)
    (first, blocks), others = views[0], views[1:]
    users = (blocks.get("overall") or {}).get("users", metrics.get("users"))
    cohort = " (the cold-item cohort)" if metrics.get("cohort_size") is not None else ""
    title = f"{step}: {users:,} {metrics.get('split', 'test')} users{cohort}" if isinstance(users, int) else step
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0),
                  header_style="bold")
    table.add_column("", no_wrap=True)
    table.add_column("\nusers", justify="right")
    columns: list[tuple[dict[str, Any], str]] = []  # (the policy's blocks, metric) per column
    k = headline_k(ks)
    groups = [(first, blocks, [f"recall@{x}" for x in ks] + [f"ndcg@{x}" for x in ks])]
    groups += [(label, other, [f"recall@{k}", f"ndcg@{k}"]) for label, other in others]
    for g, (label, source, keys) in enumerate(groups):  # the policy over its columns, a word each
        words = label.split(" ") + [""] * len(keys)
        for i, key in enumerate(keys):  # two spaces set the other policy apart
            table.add_column(f"{words[i]}\n{_short(key)}", justify="right", no_wrap=True,
                             min_width=8 if g and not i else None)
            columns.append((source, key))
    for label, path in rows(blocks, detail):
        shown = block(blocks, path) or {}
        users_here = shown.get("users")
        table.add_row(label, f"{users_here:,}" if isinstance(users_here, int) else "",
                      *[_cell(block(source, path), key) for source, key in columns])
    ranked = metrics if not metrics.get("exclude_seen") else metrics.get("other_policy") or {}
    text = notes(first, blocks.get("ranking"), bool(others), where, legend, bool(ranked.get("seen_masked")))
    blind = metrics.get("no_history") if detail and metrics.get("cohort_size") is None else None
    if isinstance(blind, dict) and all(isinstance(blind.get(m), dict) for m in ("gencli", "popularity")):
        text = (f"no history: gencli R@{k} {_cell(blind['gencli'], f'recall@{k}')}, "
                f"popularity {_cell(blind['popularity'], f'recall@{k}')}\n" + text)
    return Group(table, Text(text))


def notes(first: str, ranking: Any, both: bool, where: str | None, legend: bool = True,
          ranked_masked: bool = False) -> str:
    """What the columns mean (``legend``; ``ranked_masked``: the seen-ranked policy masked the history too, as
    gencli does where training shows no repeats), which ranking the first policy used, and where every metric is."""
    ranked = first == SEEN_RANKED or both
    if ranked and ranked_masked:
        head = "served: history masked; seen ranked: the usual protocol, masked too (no repeats)"
    else:
        head = "served: seen items masked, as recommend serves" + ("; seen ranked: the usual protocol" if ranked else "")
    lines = [head] if legend else []
    ranked = f"gencli = {blend_text(ranking)}" if isinstance(ranking, dict) else ""
    if legend or ranked:
        lines.append("; ".join(x for x in ("R/N@K Recall/NDCG@K" if legend else "", ranked) if x))
    lines.append(f"every metric: --verbose or {where}/metrics.json" if where else "every metric: --verbose")
    return "\n".join(lines)


def blend_text(ranking: dict[str, Any]) -> str:
    """``the model alone`` or ``model 0.1 + prefix 0.2 + content 0.7`` (the shares of sft's fitted blend)."""
    weight, prefix = float(ranking.get("weight", 1.0)), float(ranking.get("prefix", 0.0))
    if weight >= 1.0:
        return "the model alone"
    boost = float(ranking.get("cold", 0.0))
    return (f"model {weight:.2g} + prefix {prefix:.2g} + content {max(0.0, 1 - weight - prefix):.2g}"
            + (f", text boost {boost:g}" if boost else ""))


def _short(key: str) -> str:
    return key.replace("recall", "R").replace("ndcg", "N")
