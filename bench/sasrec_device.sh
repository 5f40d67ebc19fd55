#!/usr/bin/env bash
# SASRec (RecBole 1.2.1, its defaults: CE loss, early stopping on valid MRR@10) on a GPU machine, every exported
# split and seed side by side, for bench/baselines.py to check and score here. On a 2-core CPU one ML-100k seed
# takes about 2.5 hours (research/baselines/NOTES.md); on one GPU each run takes minutes.
#
#   python bench/baselines.py --dataset sample,ml100k,ml100k-all --seeds 0 --skip-sasrec --skip-gencli  # exports
#   bash bench/sasrec_device.sh bench/.cache/baselines OUT_DIR [SEEDS]        # on the GPU machine
#   cp OUT_DIR/*/split-*/sasrec-e0-s*.json into the same places under bench/.cache/baselines, then
#   python bench/baselines.py --dataset sample,ml100k,ml100k-all --seeds 0,1,2 --skip-gencli  # checks + scores
#
# The machine needs python3 with torch (CUDA) and RecBole importable (recbole==1.2.1, colorlog, texttable: what
# the runner imports beyond numpy, pandas, scipy, scikit-learn, pyyaml, tensorboard, psutil and tqdm). The runner
# takes NumPy 2 and pandas >= 2.2 (bench/recbole_runner.py). DEVICE=cpu EPOCHS=1 is a dry run on a CPU; PYTHON picks
# the interpreter (default python3).
set -uo pipefail
ROOT=${1:?folder holding DATASET/split-DIGEST/gencli_DATASET (bench/.cache/baselines)}
OUT=${2:-${OUT:?output folder (or set OUT)}}
SEEDS=${3:-0,1,2}
DEVICE=${DEVICE:-cuda}; EPOCHS=${EPOCHS:-0}; PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
pids=()
for split in "$ROOT"/*/split-*/; do
  split=${split%/}
  dataset=$(basename "$(dirname "$split")")
  dest="$OUT/$dataset/$(basename "$split")"
  mkdir -p "$dest"
  for seed in ${SEEDS//,/ }; do
    "$PYTHON" "$HERE/recbole_runner.py" --data "$split" --dataset "gencli_$dataset" --seed "$seed" --device "$DEVICE" \
      --epochs "$EPOCHS" --out "$dest/sasrec-e$EPOCHS-s$seed.json" >"$dest/sasrec-e$EPOCHS-s$seed.log" 2>&1 &
    pids+=("$!")
  done
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for log in "$OUT"/*/split-*/*.log; do echo "== $log"; grep -E "INFO  (epoch [0-9]+ training|Finished)" "$log" | tail -2; done
exit $status
