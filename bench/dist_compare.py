"""How close a torchrun sft is to a single-process one: two workdirs trained with the same options, compared on
what can differ (docs/distributed.md "How close to one process").

- the train loss of every logged step (sft --log-every 1 logs each one): largest relative difference;
- the weights of sft/model: largest absolute difference;
- when both workdirs ran `gencli eval` with the same options: how many users got the identical top-K list, and the
  largest difference of the scores (summed log-probabilities, so float rounding shows here first);
- the validation curve (Recall@5/@10 every --eval-every steps), printed side by side. On a few steps of a tiny model
  it is often all zero or equal by construction (a count of hits over 64 users): the numbers above are the test.

    python bench/dist_compare.py single multi              # prints the comparison
    python bench/dist_compare.py single multi --out d.json # and writes it as JSON
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _curve(workdir: Path, kind: str) -> list[dict]:
    with open(workdir / "sft" / "metrics.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r.get("kind") == kind]


def compare(a: Path, b: Path) -> dict:
    from safetensors.torch import load_file

    ta, tb = _curve(a, "train"), _curve(b, "train")
    if [r["step"] for r in ta] != [r["step"] for r in tb]:
        raise SystemExit(f"{a} and {b} logged train losses at different steps: train both with the same options")
    wa, wb = (load_file(w / "sft" / "model" / "model.safetensors") for w in (a, b))
    out = {
        "train_steps_compared": len(ta),
        "train_loss_max_rel_diff": max((abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-12)
                                        for x, y in zip(ta, tb, strict=True)), default=None),
        "weight_max_abs_diff": max(float((wa[k] - wb[k]).abs().max()) for k in wa),
        "valid_curve": {str(w): [{k: v for k, v in r.items() if k.startswith(("step", "recall"))}
                                 for r in _curve(w, "valid")] for w in (a, b)},
    }
    if all((w / "eval" / "predictions.parquet").is_file() for w in (a, b)):
        import polars as pl

        pa, pb = (pl.read_parquet(w / "eval" / "predictions.parquet") for w in (a, b))
        if pa["user_idx"].to_list() == pb["user_idx"].to_list():
            pairs = list(zip(pa["scores"].to_list(), pb["scores"].to_list(), strict=True))
            out["eval_users"] = pa.height
            out["eval_identical_lists"] = sum(x == y for x, y in zip(pa["items"].to_list(), pb["items"].to_list(),
                                                                     strict=True))
            out["eval_score_max_abs_diff"] = max(abs(s - t) for x, y in pairs for s, t in zip(x, y, strict=True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("single", type=Path, help="the workdir trained in one process")
    parser.add_argument("multi", type=Path, help="the workdir trained under torchrun")
    parser.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON here")
    args = parser.parse_args()
    result = compare(args.single, args.multi)
    print(f"train loss, {result['train_steps_compared']} steps: largest relative difference "
          f"{result['train_loss_max_rel_diff']:.2e}")
    print(f"weights: largest absolute difference {result['weight_max_abs_diff']:.2e}")
    if "eval_users" in result:
        print(f"eval, {result['eval_users']} users: identical top-K lists {result['eval_identical_lists']}/"
              f"{result['eval_users']}, largest score difference {result['eval_score_max_abs_diff']:.2e}")
    for workdir, curve in result["valid_curve"].items():
        print(f"validation {workdir}: " + ", ".join(
            f"step {r['step']} " + " ".join(f"{k} {v:.4f}" for k, v in r.items() if k != "step") for r in curve))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
