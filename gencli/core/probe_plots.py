"""The probe's pictures (matplotlib, Agg backend: no display needed).

``pca_<space>.png``: the level's code embeddings in their first two principal components, coloured by
log popularity (left) and by category (right), one file per space (semantic = the quantizer's
centroids, then each model step). ``purity.png``: P_m of the random baseline, the semantic space and
each model step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MAX_LEGEND = 12  # more categories than this: no legend (it would cover the plot)


def pca_2d(emb: np.ndarray) -> np.ndarray:
    """[n, 2] scores on the top two principal components (sign fixed: largest loading positive)."""
    centred = np.asarray(emb, np.float64) - np.asarray(emb, np.float64).mean(axis=0, keepdims=True)
    u, s, vt = np.linalg.svd(centred, full_matrices=False)
    scores = np.zeros((len(emb), 2))
    r = min(2, len(s))
    signs = np.sign(vt[np.arange(r), np.abs(vt[:r]).argmax(axis=1)])
    scores[:, :r] = u[:, :r] * s[:r] * np.where(signs == 0, 1.0, signs)
    return scores


def purity_figure(rows: Sequence[Mapping[str, Any]], level: int, m: int, ceiling: float | None = None):
    """The P_m bars of every row with a purity (None when no row has one), and the dashed ceiling ``purity_max``: the
    highest P_m these category sizes allow, which is where a bar would stand if the codes were perfectly sorted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(r["space"], r["purity"]) for r in rows if r.get("purity") is not None]
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(1.2 * len(bars) + 2, 3.6))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color=["grey", "tab:green", *["tab:blue"] * len(bars)][
        : len(bars)])
    if ceiling is not None:
        ax.axhline(ceiling, color="black", linestyle="--", linewidth=1, label=f"ceiling {ceiling:.2f} (purity_max)")
        ax.legend(fontsize=7, loc="upper right")
    ax.set_ylabel(f"P_{m} (same-category share of {m} nearest)")
    ax.set_ylim(0, 1)
    ax.set_title(f"level {level} neighbour purity")
    fig.tight_layout()
    return fig


def draw(out_dir: Path, spaces: Mapping[str, np.ndarray], used: np.ndarray, cats: Sequence[str | None],
         counts: np.ndarray, rows: Sequence[Mapping[str, Any]], level: int, m: int,
         ceiling: float | None = None) -> list[str]:
    """Write every picture into ``out_dir``; returns their file names. ``ceiling`` is drawn on the purity chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    labels = sorted({cats[k] for k in used if cats[k] is not None})
    palette = plt.get_cmap("tab20")
    colour = {c: palette(i % 20) for i, c in enumerate(labels)}
    log_pop = np.log1p(counts[used])
    for space, emb in spaces.items():
        xy = pca_2d(np.asarray(emb)[used])
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8))
        dots = left.scatter(xy[:, 0], xy[:, 1], c=log_pop, cmap="viridis", s=22)
        fig.colorbar(dots, ax=left, label="log(1 + training targets)")
        left.set_title("by popularity")
        for label in labels:
            pick = np.array([cats[k] == label for k in used])
            right.scatter(xy[pick, 0], xy[pick, 1], color=colour[label], s=22, label=label)
        none = np.array([cats[k] is None for k in used])
        if none.any():
            right.scatter(xy[none, 0], xy[none, 1], color="lightgrey", s=22, label="(no category)")
        right.set_title("by category" if labels else "no categories in the catalog")
        if 0 < len(labels) <= MAX_LEGEND:
            right.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        for ax in (left, right):
            ax.set_xlabel("PC 1")
            ax.set_ylabel("PC 2")
        fig.suptitle(f"level {level} code embeddings: {space}")
        fig.tight_layout()
        name = f"pca_{space}.png"
        fig.savefig(out_dir / name, dpi=90, metadata={"Software": None})
        plt.close(fig)
        names.append(name)
    fig = purity_figure(rows, level, m, ceiling)
    if fig is not None:
        fig.savefig(out_dir / "purity.png", dpi=90, metadata={"Software": None})
        plt.close(fig)
        names.append("purity.png")
    return names
