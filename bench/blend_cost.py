"""What the blend of model and content costs at decode time: eval's users/s with the blend and with the model alone.

On a finished workdir (default: the README's main job in bench/.cache/blend_cost, run once), eval runs
alternately with ``--ranking auto`` (gencli's blend) and ``--ranking model`` (the beam alone), ``--repeats`` times
each, under both seen-item policies; the ratio of the medians is printed side by side, so load on a shared machine
hits both alike.

    python bench/blend_cost.py                              # the sample main job, 3 repeats
    python bench/blend_cost.py --workdir runs/ml100k --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from common import CACHE, SAMPLE, gencli, write_json_atomic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    work = args.workdir
    if work is None:
        work = CACHE / "blend_cost" / "work"
        gencli(["--threads", "1", "run", str(SAMPLE / "pipeline.toml")], work)
    rows = []
    for policy in ("--include-seen", "--exclude-seen"):
        speed: dict[str, list[float]] = {"auto": [], "model": []}
        recall: dict[str, float] = {}
        for _ in range(args.repeats):
            for ranking in ("auto", "model"):
                out = gencli(["--threads", "1", "eval", "--ranking", ranking, policy, "--force"], work)["metrics"]
                speed[ranking].append(out["users_per_s"])
                recall[ranking] = out["overall"]["recall@10"]
        med = {r: statistics.median(v) for r, v in speed.items()}
        rows.append({"policy": policy, "users_per_s_blend": med["auto"], "users_per_s_model": med["model"],
                     "ratio_model_over_blend": med["model"] / med["auto"], "runs": speed,
                     "recall@10_blend": recall["auto"], "recall@10_model": recall["model"]})
        print(f"{policy}: blend {med['auto']:.1f} users/s, model alone {med['model']:.1f} users/s "
              f"({med['model'] / med['auto']:.3f}x); Recall@10 {recall['auto']:.4f} vs {recall['model']:.4f}",
              flush=True)
    write_json_atomic(CACHE / "blend_cost" / "result.json", {"workdir": str(work), "rows": rows})
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
