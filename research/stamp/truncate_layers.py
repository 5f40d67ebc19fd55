"""Make a shallower copy of a workdir's init-vocab model: keep its first K decoder layers.

A CPU cannot train smollm2-135m (30 layers) for hundreds of steps in a session, but its first
layers carry the pretrained attention habits (the attention sink, high-norm tokens) that decide how
SAP's token selection behaves. Keeping the first K layers (plus the final norm and the tied head)
gives a pretrained proxy that trains ~30/K times faster. Used for the CPU Recall@5 runs of
``--sap-score`` in docs/benchmarks.md:

    python research/stamp/truncate_layers.py --workdir W --layers 6 --out W6

copies W (ingest, quantize, init-vocab with the truncated model) to W6.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from gencli.core.lm.backbone import keep_first_layers, load_model, save_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    shutil.copytree(args.workdir, args.out, ignore=shutil.ignore_patterns("model", "sft", "cpt", "eval", "cold-eval"))
    model, tokenizer = load_model(args.workdir / "init-vocab" / "model", "cpu", torch.float32)
    n = len(model.model.layers)
    if not 2 <= args.layers < n:
        raise SystemExit(f"--layers must be in [2, {n - 1}] for this {n}-layer model")
    keep_first_layers(model, args.layers)
    save_model(model, tokenizer, args.out / "init-vocab" / "model")
    print(f"{args.out}: first {args.layers} of {n} layers, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
