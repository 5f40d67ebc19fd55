"""STAMP training speed side by side: plain sft vs SAP vs MAP vs STAMP tokens/s, from a fresh checkout.

Builds its own workdir under bench/.cache/stamp_speed/ (sample_data: ingest, embed, quantize 3 x 64 + dedup, then
``init-vocab --model MODEL``; steps already done are skipped), optionally keeps only the backbone's first
``--layers`` decoder layers (a pretrained backbone a CPU can train), then times real training steps on two mixes:

- ``long``: the latest prefix of every user whose prompt has ``--min-tokens``+ tokens (what SAP is for);
- ``mix``: sft's default training samples (windows of ``--max-history`` 50 items, the engine's batch order).

Each round trains every variant from the same weights on the same batches, one untimed warm-up step then
``--steps`` timed ones (the engine's own step, synchronised on CUDA), interleaved (base, sap, map, stamp, base, ...)
so a load swing on a shared machine hits them alike; ratios are per round, then the median and a 95% interval of
their geometric mean (Student's t over the rounds' log ratios). ``--sid-softmax`` scores the loss over the SID rows
only (sft's --sid-softmax), as STAMP is meant to be trained on a large-vocabulary backbone.

    python bench/stamp_speed.py                                   # tiny, ~1 min
    gencli models pull smollm2-135m
    python bench/stamp_speed.py --model smollm2-135m --layers 6   # the pretrained CPU proxy, 10-25 min on 2 cores
    gencli models pull smollm2-135m-6l
    python bench/stamp_speed.py --model smollm2-135m-6l --sid-softmax --mixes long --rounds 10   # #56's claim
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import torch
from common import CACHE, gencli, prepare_shared, write_json_atomic
from scipy import stats
from stamp import long_users

from gencli.config import LoopConfig, SftConfig, StampConfig
from gencli.core import artifacts
from gencli.core.data import tables
from gencli.core.device import resolve_device
from gencli.core.lm.backbone import keep_first_layers, load_model, save_model
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab, sid_rows
from gencli.core.sid import store
from gencli.core.train import batches as train_batches
from gencli.core.train import profile
from gencli.core.train.samples import SftExamples

VARIANTS = ("base", "sap", "map", "stamp")


def run_name(args) -> str:
    return Path(args.model).name + (f"-{args.layers}l" if args.layers else "")


def prepare(args) -> tuple[Path, Path]:
    """(model folder, workdir) for ``args.model``: the shared sample workdir, init-vocab, then the layer cut."""
    name = run_name(args)
    workdir = args.workroot / Path(args.model).name
    prepare_shared("sample", workdir, 3, 64)
    gencli(["init-vocab", "--model", args.model], workdir)
    model_dir = workdir / "init-vocab" / artifacts.MODEL_DIR
    if args.layers:
        cut = workdir / name
        if not (cut / "config.json").is_file():
            model, tokenizer = load_model(model_dir, "cpu", torch.float32)
            n = len(model.model.layers)
            if not 2 <= args.layers < n:
                raise SystemExit(f"--layers must be in [2, {n - 1}] for this {n}-layer model")
            keep_first_layers(model, args.layers)
            save_model(model, tokenizer, cut)
        model_dir = cut
    return model_dir, workdir


def datasets(args, workdir: Path) -> dict[str, tuple[SftExamples, list, int]]:
    """Each mix: (samples, batch order, batch size)."""
    vocab = load_sid_vocab(workdir / "init-vocab" / artifacts.SID_VOCAB)
    codes = store.load_item_codes(workdir / "quantize")
    item_tokens = item_token_ids(codes, vocab)
    train = tables.load_split(workdir / "ingest", "train")
    default = SftConfig()
    out = {}
    long = long_users(train, codes.shape[1], args.min_tokens, 40)
    data = SftExamples(long["sequence"], item_tokens, vocab, 40, 1, "prefixes")
    out["long"] = (data, train_batches.epoch_batches(data.lengths(), args.batch_size, 0, 0), args.batch_size)
    data = SftExamples(train["sequence"], item_tokens, vocab, default.max_history, 0, default.samples)
    size = args.mix_batch_size or default.micro_batch(len(data))
    out["mix"] = (data, train_batches.epoch_batches(data.lengths(), size, 0, 0), size)
    return {m: out[m] for m in args.mixes.split(",")}


def interval95(ratios: list[float]) -> list[float | None]:
    """[geometric mean, low, high] of per-round ratios: Student's t 95% interval of the mean log ratio (no interval
    from one round)."""
    logs = [math.log(x) for x in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return [round(math.exp(mean), 3), None, None]
    half = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return [round(math.exp(x), 3) for x in (mean, mean - half, mean + half)]


def run_mix(args, model_dir: Path, pad_id: int, data: SftExamples, order: list, size: int,
            rows: list[int] | None) -> dict:
    device = resolve_device(args.device)
    cfg = SftConfig(loop=LoopConfig(batch_size=size), device=device.type, dtype=args.dtype,
                    stamp=StampConfig(layer=args.layer, keep_ratio=args.keep_ratio))
    runs: dict[str, list[dict]] = {v: [] for v in args.variants}
    for r in range(args.rounds):
        batches = [order[(r * (args.steps + 1) + i) % len(order)] for i in range(args.steps + 1)]
        for v in args.variants:
            rec = profile.profile_variant(v, cfg, model_dir, data, batches, pad_id, rows, device, 1)
            runs[v].append(rec)
            print(f"  round {r} {v}: {rec['tokens_per_s']:.0f} tokens/s ({rec['tokens_per_cpu_s']:.0f} per CPU s)",
                  flush=True)
    rows = []
    for v in args.variants:
        ratio = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[v], runs["base"], strict=True)]
        cpu = [a["tokens_per_cpu_s"] / b["tokens_per_cpu_s"] for a, b in zip(runs[v], runs["base"], strict=True)]
        rows.append({"variant": v, "tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs[v]),
                     "speedup": statistics.median(ratio), "speedups": [round(x, 3) for x in ratio],
                     "tokens_per_cpu_s": statistics.median(x["tokens_per_cpu_s"] for x in runs[v]),
                     "cpu_speedup": statistics.median(cpu), "cpu_speedups": [round(x, 3) for x in cpu],
                     "cpu_interval95": interval95(cpu),
                     **{f"{phase}_s": statistics.median(x[f"{phase}_s"] for x in runs[v]) for phase in profile.PHASES},
                     "activation_mb": statistics.median(x["activation_mb"] for x in runs[v])})
    lengths = data.lengths()
    return {"samples": len(data), "mean_tokens": round(float(lengths.mean()), 1),
            "median_tokens": float(statistics.median(lengths.tolist())), "batch_size": size, "rows": rows}


def table(mix: str, res: dict) -> str:
    head = (f"{mix}: {res['samples']} samples, mean {res['mean_tokens']} / median {res['median_tokens']:.0f} tokens, "
            f"batch {res['batch_size']}\n\n| variant | tokens/s | vs base (median; rounds) | tokens/CPU-s | "
            "vs base, CPU time (median; rounds) | CPU: geometric mean [95% interval] | activations MB |\n"
            "|---|---:|---|---:|---|---|---:|\n")
    phases = "".join(f"{r['variant']}: " + ", ".join(f"{phase} {r[f'{phase}_s']:.3f}" for phase in profile.PHASES)
                     + "\n" for r in res["rows"])
    return head + "".join(
        f"| {r['variant']} | {r['tokens_per_s']:.0f} | {r['speedup']:.2f}x; {', '.join(f'{x:.2f}' for x in r['speedups'])}"
        f" | {r['tokens_per_cpu_s']:.0f} | {r['cpu_speedup']:.2f}x; {', '.join(f'{x:.2f}' for x in r['cpu_speedups'])}"
        f" | {_interval(r)} | {r['activation_mb']:.0f} |\n" for r in res["rows"]) + "\nseconds per step (median):\n" + phases


def _interval(row: dict) -> str:
    mean, low, high = row["cpu_interval95"]
    return f"{mean:.2f}x" + ("" if low is None else f" [{low:.2f}, {high:.2f}]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="init-vocab's --model: a preset or a local HF causal-LM folder")
    p.add_argument("--layers", type=int, default=0, help="keep the backbone's first N decoder layers (0 = all)")
    p.add_argument("--mixes", default="long,mix", help="long (prompts of --min-tokens+), mix (sft's default samples)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="base first (the reference)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="timed steps per variant and round (after 1 warm-up step)")
    p.add_argument("--batch-size", type=int, default=8, help="long mix")
    p.add_argument("--mix-batch-size", type=int, default=0, help="default mix (0 = sft's default)")
    p.add_argument("--min-tokens", type=int, default=128)
    p.add_argument("--sid-softmax", action="store_true", help="the loss over the SID rows only (sft --sid-softmax)")
    p.add_argument("--layer", type=int, default=StampConfig.layer, help="SAP layer (0 = gencli's default)")
    p.add_argument("--keep-ratio", type=float, default=StampConfig.keep_ratio)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared CPU)")
    p.add_argument("--workroot", type=Path, default=CACHE / "stamp_speed")
    p.add_argument("--out", type=Path, default=None, help="results JSON (default WORKROOT/MODEL.json)")
    args = p.parse_args()
    args.variants = args.variants.split(",")
    if args.variants[0] != "base" or not set(args.variants) <= set(VARIANTS):
        raise SystemExit(f"--variants: base first, then any of {', '.join(VARIANTS[1:])}")
    torch.set_num_threads(args.threads)
    model_dir, workdir = prepare(args)
    vocab = load_sid_vocab(workdir / "init-vocab" / artifacts.SID_VOCAB)
    pad_id, rows = vocab.pad_id, (sid_rows(vocab) if args.sid_softmax else None)
    device = resolve_device(args.device)
    print(f"{model_dir} on {device}, {args.rounds} rounds x (1 warm-up + {args.steps} timed steps), "
          f"{args.threads} thread(s), softmax over {'the SID rows' if rows else 'the vocabulary'}", flush=True)
    results = {"model": args.model, "layers": args.layers, "device": str(device), "rounds": args.rounds,
               "steps": args.steps, "threads": args.threads, "sid_softmax": args.sid_softmax, "mixes": {}}
    for mix, (data, order, size) in datasets(args, workdir).items():
        print(f"{mix}:", flush=True)
        results["mixes"][mix] = run_mix(args, model_dir, pad_id, data, order, size, rows)
    for mix, res in results["mixes"].items():
        print("\n" + table(mix, res))
    out = args.out or args.workroot / f"{run_name(args)}{'-sid' if args.sid_softmax else ''}.json"
    write_json_atomic(out, results)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
