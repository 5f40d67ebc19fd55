"""The page of ``gencli report``: one self-contained HTML file (styles inline, charts as PNG data URIs, no script,
and a Content-Security-Policy that lets the browser fetch nothing), from :mod:`gencli.flow.report`'s and
:mod:`gencli.flow.nights`' plain data."""

from __future__ import annotations

import base64
import html
import re
import time
from typing import Any

from gencli.ui import report_charts as charts

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}
h3{font-size:15px}table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}td.n{text-align:right;white-space:nowrap}img{max-width:100%;display:block}
.muted{color:#777}.bad{color:#b00020}.good{color:#1b7a3a}.flag{background:#fff3d6}"""
SHOWN_K = 10  # the cutoff of the eval charts (the tables show every k)


MAX_TEXT = 1000
"""The most characters of one value on the page (a title, an id, a message); a longer one ends in an ellipsis."""
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Control characters and bidirectional overrides: a terminal escape, a NUL or a right-to-left override in a title
would reach the page and reorder or hide what it shows."""


def esc(value: Any) -> str:
    """A value as page text: control and bidi characters replaced, cut to :data:`MAX_TEXT`, HTML-escaped."""
    text = CONTROL.sub("\ufffd", str(value))
    if len(text) > MAX_TEXT:
        text = text[: MAX_TEXT - 1] + "\u2026"
    return html.escape(text)


def number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return esc("" if value is None else value)
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return esc(value)


def image(data: bytes, alt: str) -> str:
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}">'


def cell(value: Any) -> str:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f'<td class="n">{number(value)}</td>' if numeric else f"<td>{number(value)}</td>"


def table(header: list[str], rows: list[list[Any]], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(f'<tr class="{(classes or [""] * len(rows))[i]}">' + "".join(cell(c) for c in row)
                   + "</tr>" for i, row in enumerate(rows))
    return f"<table><tr>{head}</tr>{body}</table>"


def page(title: str, sections: list[str]) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{esc(title)}</h1><p class=\"muted\">made by gencli report at "
            f"{esc(stamp)}</p>{''.join(sections)}</body></html>")


def render(report: dict[str, Any]) -> str:
    """The report page of one workdir."""
    sections = [status_section(report["status"]), problems_section(report["problems"])]
    sections += [training_section(t) for t in report["training"]] or [not_run("Training", "cpt, sft, rl")]
    sections += [ranking_section(r) for r in report["rankings"]] or [not_run("Evaluation", "eval, cold-eval")]
    sections.append(blend_section(report["blend"]))
    sections.append(probe_section(report["probe"]))
    sections.append(examples_section(report["examples"]))
    return page(f"gencli report: {report['workdir']}", sections)


def not_run(title: str, steps: str) -> str:
    return f'<h2>{esc(title)}</h2><p class="muted">not run ({esc(steps)})</p>'


def status_section(rows: list[dict[str, Any]]) -> str:
    body = [[r["step"], r["state"], (r.get("finished") or "").replace("T", " "), r.get("seconds"),
             ", ".join(f"{k}={number(v)}" for k, v in r["key_metrics"].items())] for r in rows]
    classes = ["bad" if r["state"] in ("failed", "stale") else "muted" if r["state"] == "not run" else ""
               for r in rows]
    return "<h2>Status</h2>" + table(["step", "state", "finished", "seconds", "key metrics"], body, classes)


def problems_section(problems: list[dict[str, str]]) -> str:
    if not problems:
        return ""
    items = "".join(f"<li><code>{esc(p['file'])}</code>: {esc(p['error'])}</li>" for p in problems)
    return f'<h2 class="bad">Files that could not be read</h2><ul class="bad">{items}</ul>'


def training_section(t: dict[str, Any]) -> str:
    summary = table(["metric", "value"], [[k, v] for k, v in t["summary"].items()])
    chart = image(charts.training_chart(t), f"{t['step']} training curves") if t["train"] or t["valid"] else ""
    valid = ""
    if t["valid"]:
        keys = charts.validation_keys(t["valid"])
        valid = "<h3>Validations</h3>" + table(
            ["step", *keys, "kept"], [[v["step"], *(v.get(k) for k in keys), "kept" if v["step"] == t["kept_step"]
                                       else ""] for v in t["valid"]])
    return (f"<h2>Training: {esc(t['step'])}</h2><p>stopped: <b>{esc(t['stop_reason'] or 'n/a')}</b>; kept "
            f"<b>{esc(t['kept'])}</b></p>{chart}{summary}{valid}")


def policy_name(exclude_seen: Any) -> str:
    return "served (seen items masked)" if exclude_seen else "seen ranked (seen items ranked like any other)"


def ranking_section(r: dict[str, Any]) -> str:
    ks = r["k"] if isinstance(r["k"], list) else [SHOWN_K]
    k = SHOWN_K if SHOWN_K in ks else ks[0]
    head = (f"<h2>{esc(r['step'])}</h2><p>split {esc(r['split'])}, {number(r['users'])} users, {number(r['beams'])} "
            f"beams" + (f", cohort {number(r['cohort_size'])}" if r.get("cohort_size") is not None else "") + "</p>")
    parts = [head]
    for policy in r["policies"]:
        metrics = [f"{m}@{n}" for m in ("recall", "ndcg") for n in ks]
        blocks = table(["block", *metrics, "users"], [[name.replace("_", " "), *(b.get(m) for m in metrics),
                                                       b.get("users")] for name, b in policy["blocks"].items()])
        history = policy["by_history"]
        buckets = list(dict.fromkeys(b for m in history.values() for b in m))
        by_history = table(["recall@10 by history", *buckets], [[m, *((v.get(b) or {}).get("recall@10") for b in buckets)]
                                                             for m, v in history.items()])
        ranking = policy.get("ranking") or {}
        parts.append(f"<h3>{esc(policy_name(policy['exclude_seen']))}; blend {esc(ranking)}</h3>"
                     + image(charts.ranking_chart(policy, k), f"{r['step']} {policy_name(policy['exclude_seen'])}")
                     + blocks + by_history)
    return "".join(parts)


def blend_section(b: dict[str, Any] | None) -> str:
    if not b:
        return not_run("Blend", "sft or rl with a valid split")
    rows = [[policy, *(share for _, share, _ in charts.blend_parts(v)), v.get("temperature")]
            for policy, v in b["blends"].items()]
    valid = ""
    if isinstance(b.get("valid"), dict):
        valid = "<h3>Validation (served)</h3>" + table(
            ["ranking", "recall@10", "ndcg@10"], [[m, v.get("recall@10"), v.get("ndcg@10")] for m, v in
                                                  b["valid"].items() if isinstance(v, dict)])
    return (f"<h2>Blend ({esc(b['step'])})</h2>" + image(charts.blend_chart(b["blends"]), "blend shares")
            + table(["policy", "model", "model x content", "content", "temperature"], rows) + valid)


def probe_section(pictures: list[dict[str, Any]]) -> str:
    if not pictures:
        return not_run("Probe", "probe")
    return "<h2>Probe</h2>" + "".join(f"<h3>{esc(p['name'])}</h3>{image(p['png'], p['name'])}" for p in pictures)


def examples_section(examples: dict[str, Any] | None) -> str:
    if not examples:
        return not_run("Recommendations", "recommend, or its lists are not current")
    parts = [f"<h2>Recommendations</h2><p class=\"muted\">from {esc(examples['file'])} ({examples['k']} per user)</p>"]
    for user in examples["users"]:
        history = ", ".join(user["history"][-5:])
        parts.append(f"<h3>user {esc(user['user_id'])}</h3><p class=\"muted\">last seen: {esc(history)}</p>"
                     + table(["rank", "item", "title", "score"], [[i + 1, it["item_id"], it["title"], it["score"]]
                                                                  for i, it in enumerate(user["items"])]))
    return "".join(parts)


def render_nights(data: dict[str, Any]) -> str:
    """The nights page: each key metric across nights, the decisions and their reasons, the flagged drops."""
    nights, metrics = data["nights"], data["metrics"]
    rows, classes = [], []
    for n in nights:
        flags = "; ".join(f"{m}: {why}" for m, why in n["flags"].items())
        rows.append([n["name"], n["finished"] or "", *(n["metrics"].get(m) for m in metrics),
                     n["decision"] or "", n["reason"] or ("workdir missing" if n["missing"] else ""), flags])
        classes.append("flag" if n["flags"] else "bad" if n["decision"] == "refused" else "")
    chart = image(charts.nights_chart(nights, metrics), "key metrics across nights") if metrics else ""
    note = (f"<p>A flagged night fell more than {data['threshold']:.0%} below the last promoted night. Green: "
            "promoted; red cross: refused; orange ring: flagged.</p>")
    return page(f"gencli report: {len(nights)} nights", [
        "<h2>Nights</h2>", note, chart,
        table(["night", "finished", *metrics, "promotion", "reason", "flags"], rows, classes),
        problems_section(data["problems"])])


def print_written(path: Any, size: int, problems: list[dict[str, str]]) -> None:
    """The line after ``gencli report``: where the page is, its size, and each file it could not read."""
    from rich.markup import escape

    from gencli.ui.output import console

    console().print(f"[green]✓[/green] report written to {escape(str(path))} ({size / 1024:,.0f} KB)")
    print_problems(problems)


def print_problems(problems: list[dict[str, str]]) -> None:
    """A warning on stderr for each file the report could not read."""
    from rich.markup import escape

    from gencli.ui.output import console

    for p in problems:
        console(stderr=True).print(f"[yellow]warning[/yellow]: could not read {escape(p['file'])}: "
                                   f"{escape(p['error'])}", soft_wrap=True)
