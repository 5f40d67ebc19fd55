#!/bin/bash
# usage: rlexp.sh NAME SRC_WORKDIR [gencli rl options...]   (gencli on PATH; RL_ROOT: where work and results go)
set -u
name=$1; src=$2; shift 2
root=${RL_ROOT:-$(dirname "$0")/.cache}
mkdir -p "$root/work" "$root/results"
w=$root/work/rl-$name
rm -rf "$w"; cp -r "$src" "$w"
start=$(date +%s)
gencli --threads 1 rl --workdir "$w" --json "$@" > "$root/results/rl-$name.json" 2> "$root/results/rl-$name.err"
echo "$name rc=$? wall=$(( $(date +%s) - start ))s"
python3 - "$w" <<'PY'
import json, sys
for l in open(sys.argv[1] + "/rl/metrics.jsonl"):
    d = json.loads(l)
    if d["kind"] == "valid":
        print(d["step"], "blend R@10 %.4f N@10 %.4f | model R@10 %.4f N@10 %.4f" % (d["recall@10"], d["ndcg@10"], d["model_recall@10"], d["model_ndcg@10"]), d["eval_time_s"])
PY
if [ -n "$EVAL" ]; then
  for pol in --exclude-seen --include-seen; do
    for model in sft rl; do
      gencli --threads 1 eval --workdir $w --split valid --ranking model --model-step $model $pol --beams 20 --k 5,10,20 --force --json 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin)['metrics']['overall']; print('$model $pol valid model-alone R@10 %.4f N@10 %.4f' % (d['recall@10'], d['ndcg@10']))"
    done
  done
fi
