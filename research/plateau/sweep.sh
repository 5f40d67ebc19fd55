#!/usr/bin/env bash
# Plateau sweep on the sample data (issue #17): one shared ingest/embed/quantize/init-vocab workdir (the settings of
# sample_data/pipeline.toml), each variant copies it, trains sft to the plateau (validation on every valid user,
# early stopping), then evaluates the best checkpoint on valid and test (beams 20). One job at a time, 1 thread.
#   research/plateau/sweep.sh                      all variants below, seed 0
#   SEEDS="0 1 2" research/plateau/sweep.sh base   chosen variants over seeds
# Results: $ROOT/<variant>-s<seed>.{sft,valid,test}.json; research/plateau/table.py prints the table.
set -uo pipefail
export GENCLI_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=${ROOT:-$REPO/.work-plateau/sample}
SEEDS=${SEEDS:-0}
SHARED=$ROOT/shared
S=$REPO/sample_data
G="gencli --threads 1"
mkdir -p "$ROOT"
if [ ! -f "$SHARED/init-vocab/step.json" ]; then
  $G ingest --items $S/items.csv --interactions $S/interactions.csv --user-core 5 --item-core 5 --workdir $SHARED \
    --json >/dev/null &&
  $G embed --workdir $SHARED --json >/dev/null &&
  $G quantize --levels 3 --codes 64 --seed 0 --workdir $SHARED --json >/dev/null &&
  $G init-vocab --model tiny --init centroid --projection pca --seed 0 --workdir $SHARED --json >/dev/null || exit 1
fi
# The plateau budget every variant shares (4 validations per epoch = every 102 steps on the sample, patience 8 = two
# epochs, every valid user); a variant adds or overrides options after it (click keeps the last --epochs).
PLATEAU="--epochs 30 --patience 8 --eval-every 0 --evals-per-epoch 4 --eval-users 0 --eval-beams 10 --batch-size 32"
declare -A V=(
  [base]="--lr 0.003 --max-history 10"
  [cap2]="--lr 0.003 --max-history 10 --epochs 2"
  [cap5]="--lr 0.003 --max-history 10 --epochs 5"
  [cap10]="--lr 0.003 --max-history 10 --epochs 10"
  [lr1e-3]="--lr 0.001 --max-history 10"
  [wd0.1]="--lr 0.003 --max-history 10 --weight-decay 0.1"
  [hist20]="--lr 0.003 --max-history 20"
  [linear]="--lr 0.003 --max-history 10 --schedule linear"
  [drop0.1]="--lr 0.003 --max-history 10"   # + attention_dropout 0.1 in the model's config.json
  [cap20]="--lr 0.003 --max-history 10 --epochs 20"
  [c10wd0.1]="--lr 0.003 --max-history 10 --epochs 10 --weight-decay 0.1"
  [c10drop0.1]="--lr 0.003 --max-history 10 --epochs 10"
  [c10lr1e-3]="--lr 0.001 --max-history 10 --epochs 10"
  [c10hist20]="--lr 0.003 --max-history 20 --epochs 10"
  [defaults]=""   # the new sft defaults as shipped (cap, cadence, patience, users, lr, max-history)
  # sample_data/pipeline.toml's [sft] table (the main job's quickstart), over the new defaults
  [toml]="--epochs 2 --batch-size 32 --lr 0.003 --max-history 10 --eval-every 200 --eval-users 200"
)
variant() {  # name seed
  local w=$ROOT/$1-s$2
  grep -qs '"status": "done"' "$w.sft.json" && [ -s "$w.test.json" ] && return 0
  rm -rf "$w"; cp -r "$SHARED" "$w"
  case $1 in *drop0.*) python - "$w/init-vocab/model/config.json" "0.${1##*drop0.}" <<'PY'
import json, sys
p, rate = sys.argv[1], float(sys.argv[2])
c = json.load(open(p)); c["attention_dropout"] = rate; json.dump(c, open(p, "w"), indent=2)
PY
  ;; esac
  local t0=$SECONDS
  local budget=$PLATEAU; case $1 in defaults|toml) budget="";; esac
  $G sft $budget ${V[$1]} ${EXTRA:-} --seed "$2" --workdir "$w" --json > "$w.sft.json" || return 1
  echo "{\"wall_s\": $((SECONDS - t0))}" > "$w.wall.json"
  $G eval --split valid --beams 20 --k 5,10,20 --workdir "$w" --json > "$w.valid.json" &&
  $G eval --split test --beams 20 --k 5,10,20 --force --workdir "$w" --json > "$w.test.json"
}
NAMES=${*:-"base lr1e-3 wd0.1 drop0.1 hist20 linear"}
for seed in $SEEDS; do for name in $NAMES; do variant "$name" "$seed"; done; done
