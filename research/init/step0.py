"""Step-0 cross-entropy of each SID init on a pretrained backbone (docs/benchmarks.md, "SID rows on a pretrained
backbone"): for every init, init-vocab in a copy of WORKDIR (ingest, embed and quantize done), then the full-softmax
cross-entropy per SID token of the first 48 validation users' next item, teacher-forced, and the range of the
level-0 SID logits at the position that predicts level 0.

    python research/init/step0.py --workdir W --model smollm2-135m-6l [--inits random,mean,paper,principal]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import torch

from gencli.core.data import tables
from gencli.core.lm.backbone import load_model
from gencli.core.lm.prompt import build_prompt, item_token_ids, load_sid_vocab

INITS = {"random": ["--init", "random"], "mean": ["--init", "mean"],
         "paper": ["--init", "centroid", "--projection", "truncate", "--scale", "none"],
         "literal": ["--init", "centroid", "--projection", "pca", "--scale", "none"],
         "pca-scale": ["--init", "centroid", "--projection", "pca"], "principal": ["--init", "centroid"],
         "shared": ["--init", "centroid", "--projection", "shared", "--scale", "none"],
         "shared-scale": ["--init", "centroid", "--projection", "shared", "--scale", "shared"],
         "gti": ["--init", "gti"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--inits", default=",".join(INITS))
    p.add_argument("--users", type=int, default=48)
    p.add_argument("--work", type=Path, default=Path("bench/.cache/step0"))
    args = p.parse_args()
    torch.set_num_threads(1)
    valid = tables.load_split(args.workdir / "ingest", "valid")
    for name in args.inits.split(","):
        w = args.work / f"{Path(args.model).name}-{name}"
        if not (w / "init-vocab" / "model").is_dir():
            shutil.rmtree(w, ignore_errors=True)
            shutil.copytree(args.workdir, w)
            subprocess.run(["gencli", "--threads", "1", "init-vocab", "--model", args.model, *INITS[name],
                            "--workdir", str(w), "--json"], check=True, capture_output=True)
        model, _ = load_model(w / "init-vocab" / "model", "cpu", torch.float32)
        vocab = load_sid_vocab(w / "init-vocab" / "sid_vocab.json")
        codes = np.stack(pl.read_parquet(w / "quantize" / "sids.parquet")["codes"].to_list())
        items = item_token_ids(codes, vocab)
        head, depth = model.get_output_embeddings().weight, items.shape[1]
        level0 = torch.as_tensor(vocab.token_ids[0])
        ce, spread = [], []
        with torch.no_grad():
            for row in range(min(args.users, valid.height)):
                prompt = build_prompt(valid["history"][row].to_list(), items, 50, vocab.bos_id)
                ids = prompt + items[int(valid["target"][row])].tolist()
                logits = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0] @ head.T
                for j in range(depth):
                    pos = len(ids) - depth - 1 + j
                    ce.append(float(torch.nn.functional.cross_entropy(logits[pos:pos + 1], torch.tensor([ids[pos + 1]]))))
                at = logits[len(ids) - depth - 1, level0]
                spread.append(float(at.max() - at.min()))
        print(f"{name}: full-softmax CE per SID token {np.mean(ce):.2f}, level-0 SID logit range {np.mean(spread):.2f}")


if __name__ == "__main__":
    main()
