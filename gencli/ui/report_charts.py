"""The charts of ``gencli report``, drawn with matplotlib (Agg) from the plain data of :mod:`gencli.flow.report`
and :mod:`gencli.flow.nights`; each returns PNG bytes, which the page embeds as a data URI."""

from __future__ import annotations

import io
from typing import Any

DPI = 80
WIDE = (10.0, 3.2)  # inches: 800 x 256 pixels at DPI
COLORS = {"promoted": "#2a9d4a", "refused": "#d1495b", "flagged": "#e8a33d", "kept": "#d1495b"}


def plain_text(draw):
    """Draw with every label taken as plain text: matplotlib reads ``$...$`` in a title, a tick or a legend as TeX
    (mathtext), and a metric key or a night's folder name holding one would end the chart in a ParseError."""
    import functools

    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return drawn


def _figure(rows: int, cols: int, size: tuple[float, float]):
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False)


def png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


@plain_text
def training_chart(t: dict[str, Any]) -> bytes:
    """Loss, every validation (the kept checkpoint marked, why training stopped), learning rate, tokens/s."""
    fig, axes = _figure(1, 4, (12.0, 3.0))
    train, valid = t["train"], t["valid"]
    steps = [r["step"] for r in train]
    for ax, key, title in ((axes[0][0], "loss", "training loss"), (axes[0][2], "lr", "learning rate"),
                           (axes[0][3], "tokens_per_s", "tokens/s")):
        ax.plot(steps, [r.get(key) for r in train], color="#3366aa", linewidth=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    ax = axes[0][1]
    for key in validation_keys(valid):
        ax.plot([r["step"] for r in valid], [r.get(key) for r in valid], marker="o", markersize=3, label=key)
    if t.get("kept_step"):
        ax.axvline(t["kept_step"], color=COLORS["kept"], linestyle="--", linewidth=1, label="kept")
    ax.set_title(f"validation (stopped: {t.get('stop_reason') or 'n/a'})", fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    if valid:
        ax.legend(fontsize=7)
    return png(fig)


def validation_keys(valid: list[dict[str, Any]]) -> list[str]:
    """The ranking metrics a validation line holds (``recall@5``, ``ndcg@10``, ...), at most three."""
    keys = [k for k in (valid[0] if valid else {}) if "@" in k and isinstance(valid[0][k], (int, float))]
    return keys[:3]


@plain_text
def ranking_chart(policy: dict[str, Any], k: int) -> bytes:
    """Recall@k and NDCG@k of each block (overall, by popularity, the baselines), then Recall@10 by history length
    for gencli and each baseline."""
    fig, axes = _figure(1, 2, WIDE)
    blocks = policy["blocks"]
    names = list(blocks)
    ax = axes[0][0]
    width = 0.4
    for i, metric in enumerate((f"recall@{k}", f"ndcg@{k}")):
        ax.bar([x + i * width for x in range(len(names))], [blocks[n].get(metric) or 0 for n in names], width,
               label=metric)
    ax.set_xticks([x + width / 2 for x in range(len(names))], [n.replace("_", " ") for n in names], fontsize=7,
                  rotation=20)
    ax.set_title("by block", fontsize=10)
    ax.legend(fontsize=7)
    ax.tick_params(labelsize=7)
    ax = axes[0][1]
    history = policy["by_history"]
    methods = list(history)
    buckets = list(dict.fromkeys(b for m in methods for b in history[m]))
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        ax.bar([x + i * width for x in range(len(buckets))],
               [(history[method].get(b) or {}).get("recall@10") or 0 for b in buckets], width, label=method)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(buckets))], buckets, fontsize=7)
    ax.set_title("recall@10 by history length", fontsize=10)
    ax.tick_params(labelsize=7)
    if methods:
        ax.legend(fontsize=7)
    return png(fig)


@plain_text
def blend_chart(blends: dict[str, dict[str, Any]]) -> bytes:
    """Each seen-item policy's shares: the model alone, the model region times content, content alone."""
    fig, axes = _figure(1, 1, (10.0, 1.2 + 0.4 * len(blends)))
    ax = axes[0][0]
    for y, b in enumerate(blends.values()):
        left = 0.0
        for part, share, color in blend_parts(b):
            ax.barh(y, share, left=left, color=color, label=part if y == 0 else None)
            left += share
    ax.set_yticks(range(len(blends)), [p.replace("_", " ") for p in blends], fontsize=8)
    ax.set_xlim(0, 1)
    ax.legend(fontsize=7, ncols=3, loc="lower right")
    return png(fig)


def blend_parts(b: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(part, share, colour) of one fitted blend: ``weight`` the model, ``prefix`` model x content, the rest content."""
    weight, prefix = float(b.get("weight") or 0), float(b.get("prefix") or 0)
    return [("model", weight, "#3366aa"), ("model x content", prefix, "#8a6fb5"),
            ("content", max(0.0, 1 - weight - prefix), "#6fb58a")]


@plain_text
def nights_chart(nights: list[dict[str, Any]], metrics: list[str]) -> bytes:
    """Each key metric across nights; promoted nights green, refused red, flagged ones ringed in orange."""
    fig, axes = _figure(len(metrics), 1, (10.0, 2.2 * len(metrics)))
    labels = [n["name"] for n in nights]
    for row, metric in zip(axes, metrics, strict=True):
        ax = row[0]
        values = [n["metrics"].get(metric) for n in nights]
        xs = [i for i, v in enumerate(values) if v is not None]
        ax.plot(xs, [values[i] for i in xs], color="#888888", linewidth=1)
        for i in xs:
            state = nights[i].get("decision")
            color = COLORS["promoted"] if state == "promoted" else COLORS["refused"] if state == "refused" else "#3366aa"
            ax.scatter([i], [values[i]], color=color, marker="x" if state == "refused" else "o", zorder=3)
            if metric in nights[i].get("flags", {}):
                ax.scatter([i], [values[i]], s=160, facecolors="none", edgecolors=COLORS["flagged"], zorder=4)
        ax.set_title(metric, fontsize=10)
        ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=20)
        ax.set_xlim(-0.5, len(labels) - 0.5)  # every chart spans every night, whichever it has
        ax.tick_params(labelsize=7)
    return png(fig)
