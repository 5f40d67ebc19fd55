#!/usr/bin/env bash
# Models for the probe evidence: the init comparison's pure-SFT budget (bench/init_compare.py, docs/benchmarks.md),
# random vs centroid init, seeds 0 1 2, on DATASET = sample | ml100k. One shared ingest/embed/quantize workdir;
# each variant copies it and runs init-vocab -> sft. At most 2 trainings at once (2 shared cores), 1 thread each.
#   research/probe/train.sh sample        research/probe/train.sh ml100k
# ml100k reads RecBole's copy: pip download recbole==1.2.1 --no-deps, unzip recbole/dataset_example/ml-100k/
# into $ROOT/dl (never committed).
set -uo pipefail
export GENCLI_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
DATASET=${1:-sample}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=${ROOT:-$REPO/.work-probe/$DATASET}
SEEDS=${SEEDS:-"0 1 2"}
SHARED=$ROOT/shared
S=$REPO/sample_data
mkdir -p "$ROOT"
if [ "$DATASET" = sample ]; then
  gencli --threads 1 ingest --items $S/items.csv --interactions $S/interactions.csv --workdir $SHARED --json >/dev/null
else
  gencli --threads 1 ingest --format movielens --items $ROOT/dl/recbole/dataset_example/ml-100k --workdir $SHARED \
    --json >/dev/null
fi || exit 1
gencli --threads 1 embed --workdir $SHARED --json >/dev/null || exit 1
gencli --threads 1 quantize --levels 3 --codes 32 --seed 0 --workdir $SHARED --json >/dev/null || exit 1
variant() {  # init seed
  local w=$ROOT/sft-$1-s$2
  grep -qs '"status": "done"' "$w/sft/step.json" && return 0
  rm -rf "$w"; cp -r "$SHARED" "$w"
  gencli --threads 1 init-vocab --model tiny --init "$1" --seed "$2" --workdir "$w" --json > "$w.init-vocab.json" &&
  gencli --threads 1 sft --max-steps 400 --patience 0 --batch-size 32 --lr 0.003 --max-history 10 --eval-every 50 \
    --eval-users 100 --eval-beams 10 --seed "$2" --workdir "$w" --json > "$w.sft.json"
}
for seed in $SEEDS; do
  variant random "$seed" & variant centroid "$seed" & wait
done
echo "trained $DATASET"
