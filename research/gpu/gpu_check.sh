#!/usr/bin/env bash
# One prepared GPU check (issue #41), sized for one call of at most 9 minutes on one H200 (BUDGET seconds, 420 by
# default, bound every job; what finished by then is in the tables):
#
#   1. STAMP against plain sft on smollm2-135m (sample data, prefix samples, the settings of #5's H200 run: 300 steps,
#      batch 32, lr 2e-4, history 40, seeds 0 and 1): training tokens/s and peak CUDA memory from bench/stamp.py
#      speed (base and stamp interleaved in one process, the GPU otherwise idle), and Recall@10 / NDCG@10 of the
#      trained models on every valid and every test user, paired seed by seed (bench/paired_recall.py).
#   2. SID row init (#45): centroid (the default: rows at the base spread on its principal directions),
#      centroid-literal (the paper's unscaled centred centroids in model dims 0..m-1), random and gti on smollm2-135m, sft to the plateau (gencli's defaults, window
#      samples, validation on 500 users, patience 2, but lr 2e-4, INIT_EPOCHS = 4 epochs so that the learning rate
#      decays inside the budget, and INIT_EVALS = 2 validations per epoch; --max-time is a safety net), then eval
#      (Recall@5/@10, the blend and the model alone) and cold-eval (items seen at most once as a training target).
#   3. gencli serve on the GPU against a loop of Recommender.recommend calls (bench/serve.py), on a bundle exported
#      from the seed-0 plain sft model, measured while nothing else runs on the GPU.
#
# Several jobs share the GPU in step 2 (a 135M model leaves most of an H200 idle); the speed measurement and the
# serve bench run alone. Workdir copies (with their models) go under WORK, never under the output folder.
#
#   GENCLI_HOME=/path/with/smollm2 bash research/gpu/gpu_check.sh SAMPLE_WORKDIR [OUT_DIR]      # OUT_DIR default: $OUT
#
# SAMPLE_WORKDIR holds ingest, embed and quantize (3 x 64 codes, as sample_data/pipeline.toml) of sample_data, and
# `gencli models pull smollm2-135m` has run. The tables land in OUT_DIR/tables.md (research/gpu/gpu_tables.py), the raw
# JSON in OUT_DIR/json and the logs in OUT_DIR/logs. A dry run on a CPU (tiny backbone, a few steps):
#
#   DEVICE=cpu MODEL=tiny STAMP_STEPS=4 SPEED_ROUNDS=1 SPEED_STEPS=1 SPEED_BATCH=4 INIT_TRAIN_S=20 INIT_EPOCHS=1 \
#     SERVE_REQUESTS=20 SERVE_TIME=3 THREADS=1 BUDGET=1500 bash research/gpu/gpu_check.sh W dry-out
set -uo pipefail
SAMPLE=${1:?usage: bash research/gpu/gpu_check.sh SAMPLE_WORKDIR [OUT_DIR]}
RESULTS=${2:-${OUT:-}}
[ -n "$RESULTS" ] || { echo "research/gpu/gpu_check.sh: give an output folder or set OUT" >&2; exit 2; }
for step in ingest embed quantize; do
  [ -f "$SAMPLE/$step/step.json" ] || { echo "research/gpu/gpu_check.sh: $SAMPLE has no finished $step step" >&2; exit 2; }
done
DEVICE=${DEVICE:-cuda}; MODEL=${MODEL:-smollm2-135m}; LR=${LR:-2e-4}; SEEDS=${SEEDS:-0 1}; THREADS=${THREADS:-2}
STAMP_STEPS=${STAMP_STEPS:-300}; STAMP_BATCH=${STAMP_BATCH:-32}; STAMP_HISTORY=${STAMP_HISTORY:-40}
STAMP_VAL_USERS=${STAMP_VAL_USERS:-400}; EVAL_BEAMS=${EVAL_BEAMS:-20}
SPEED_ROUNDS=${SPEED_ROUNDS:-4}; SPEED_STEPS=${SPEED_STEPS:-8}; SPEED_BATCH=${SPEED_BATCH:-64}
SPEED_MIN_TOKENS=${SPEED_MIN_TOKENS:-128}  # the speed samples: users whose latest prompt has this many tokens
INITS=${INITS:-centroid centroid-literal random gti}; INIT_TRAIN_S=${INIT_TRAIN_S:-200}; INIT_EPOCHS=${INIT_EPOCHS:-4}
INIT_EVALS=${INIT_EVALS:-2}  # validations per epoch: the step of the peak to half an epoch
SERVE_REQUESTS=${SERVE_REQUESTS:-300}; SERVE_TIME=${SERVE_TIME:-8}; SERVE_CONC=${SERVE_CONC:-1,16,64}
PARTS=${PARTS:-stamp init serve}  # which of the three checks run (a rerun of one of them: PARTS=stamp INITS=centroid)
BUDGET=${BUDGET:-420}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-${GENCLI_BENCH_CACHE:-$REPO/bench/.cache}/gpu-check}  # workdir copies with their models (tens of GB)
SERVE_RESERVE=${SERVE_RESERVE:-90}  # seconds kept for step 4 (export, serve, tables) when the training jobs start
EVAL_RESERVE=${EVAL_RESERVE:-70}    # seconds an init run keeps after training for its blend fit, eval and cold-eval
PAIRED_RESERVE=${PAIRED_RESERVE:-80}  # seconds the STAMP runs keep after training for validation and the paired decode
# one checkpoint at the end instead of one per validation (1.6 GB each with smollm2's optimizer state); best/ is
# still kept at every new best
SAVE="--save-every 1000000 --keep-checkpoints 1"

SAMPLE=$(cd "$SAMPLE" && pwd)
mkdir -p "$RESULTS/json" "$RESULTS/logs" && RESULTS=$(cd "$RESULTS" && pwd)
rm -rf "$WORK" && mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd) || exit 2
cd "$REPO" || exit 2  # the repository root: bench/ scripts and python -m gencli
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 GENCLI_THREADS=$THREADS OMP_NUM_THREADS=$THREADS GENCLI_BENCH_CACHE=$WORK/cache
DEADLINE=$(( $(date +%s) + BUDGET ))
STOP=$DEADLINE  # what bounded() stops at: lowered while the training jobs run, so that serve keeps its time
STATUS=$RESULTS/logs/status

init_flags() { case $1 in centroid-literal) echo "--init centroid --projection pca --no-scale" ;; *) echo "--init $1" ;; esac; }
note() { echo "$(date +%T) $*" | tee -a "$STATUS"; }
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }  # has stamp: that check is in PARTS
bounded() {  # a command stopped at STOP (exit 124), or not started when under 10 s remain
  local s=$(( STOP - $(date +%s) ))
  [ "$s" -gt 10 ] || { note "out of time, skipped: $*"; return 124; }
  timeout -k 10 "$s" "$@"
}
g() {  # g NAME WORKDIR ARGS...: one gencli step, its JSON in json/NAME.json, its log in logs/NAME.log
  local name=$1 wd=$2 rc; shift 2
  bounded "$PYTHON" -m gencli "$@" --workdir "$wd" --json > "$RESULTS/json/$name.json" 2> "$RESULTS/logs/$name.log"
  rc=$?; note "$name exit $rc"; return $rc
}
py() {  # py NAME SCRIPT ARGS...: a bench script, its output in logs/NAME.log
  local name=$1 rc; shift
  bounded "$PYTHON" "$@" > "$RESULTS/logs/$name.log" 2>&1
  rc=$?; note "$name exit $rc"; return $rc
}

{
  echo "device $DEVICE, model $MODEL, budget ${BUDGET}s, started $(date -u +%FT%TZ)"
  "$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
'cuda', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  nproc
} > "$RESULTS/logs/machine.txt" 2>&1
cat "$RESULTS/logs/machine.txt"

# 1. init-vocab for every init, side by side (centroid also feeds STAMP and serve)
for init in $INITS; do
  cp -r "$SAMPLE" "$WORK/init-$init"
  # shellcheck disable=SC2046  # init_flags is several words on purpose
  g "init-vocab-$init" "$WORK/init-$init" init-vocab --model "$MODEL" $(init_flags "$init") --seed 0 --device "$DEVICE" &
done
wait
[ -d "$WORK/init-centroid/init-vocab/model" ] || { note "init-vocab centroid failed: see logs"; exit 1; }
for s in $SEEDS; do  # the STAMP runs' workdirs, copied before any job writes into init-centroid
  for v in base stamp; do cp -r "$WORK/init-centroid" "$WORK/stamp-$v-s$s"; done
done

# 2. STAMP speed and memory, alone on the GPU: base and stamp interleaved, fresh model per round
if has stamp; then
  py stamp-speed bench/stamp.py speed --workdir "$WORK/init-centroid" --device "$DEVICE" --batch-size "$SPEED_BATCH" \
    --rounds "$SPEED_ROUNDS" --steps "$SPEED_STEPS" --min-tokens "$SPEED_MIN_TOKENS" --layer 0 --variants base,stamp \
    --out "$RESULTS/json/stamp-speed.json"
fi

stamp_runs() {  # plain and STAMP sft per seed, side by side; then the paired decode of each seed's pair
  local s v train_s=$(( STOP - $(date +%s) - PAIRED_RESERVE ))  # a safety net: at the expected speed they finish
  [ "$train_s" -gt 30 ] || train_s=30
  for s in $SEEDS; do
    for v in base stamp; do
      g "sft-stamp-$v-s$s" "$WORK/stamp-$v-s$s" sft --samples prefixes --max-steps "$STAMP_STEPS" \
        --batch-size "$STAMP_BATCH" --lr "$LR" --max-history "$STAMP_HISTORY" --eval-users "$STAMP_VAL_USERS" \
        --eval-beams "$EVAL_BEAMS" --eval-every "$STAMP_STEPS" --patience 0 --seed "$s" --max-time "$train_s" \
        --device "$DEVICE" $SAVE $([ "$v" = stamp ] && echo --stamp) &
    done
  done
  wait
  for s in $SEEDS; do
    py "paired-s$s" bench/paired_recall.py --workdir "$WORK/stamp-base-s$s" --model "base=$WORK/stamp-base-s$s/sft" \
      --model "stamp=$WORK/stamp-stamp-s$s/sft" --ref base --max-history "$STAMP_HISTORY" --beams "$EVAL_BEAMS" \
      --batch-size 64 --device "$DEVICE" --dtype auto --threads "$THREADS" --out "$RESULTS/json/paired-s$s.json" &
  done
  wait
}

init_run() {  # sft to the plateau from one init, then eval and cold-eval (blend and model alone in each)
  local init=$1 w=$WORK/init-$1 train_s
  [ -d "$w/init-vocab/model" ] || return 1
  train_s=$(( STOP - $(date +%s) - EVAL_RESERVE ))  # --max-time stops training and keeps the best checkpoint
  [ "$train_s" -lt "$INIT_TRAIN_S" ] || train_s=$INIT_TRAIN_S
  [ "$train_s" -gt 10 ] || { note "no time left to train $init"; return 1; }
  g "sft-init-$init" "$w" sft --lr "$LR" --seed 0 --epochs "$INIT_EPOCHS" --evals-per-epoch "$INIT_EVALS" \
    --max-time "$train_s" --device "$DEVICE" $SAVE || return 1
  g "eval-init-$init" "$w" eval --beams "$EVAL_BEAMS" --k 5,10 --device "$DEVICE"
  g "cold-eval-init-$init" "$w" cold-eval --max-train-count 1 --beams "$EVAL_BEAMS" --k 5,10 --device "$DEVICE"
}

# 3. the training jobs side by side on the GPU, stopped in time for step 4
STOP=$(( DEADLINE - SERVE_RESERVE ))
has stamp && stamp_runs &
if has init; then for init in $INITS; do init_run "$init" & done; fi
wait
STOP=$DEADLINE

# 4. serve on the GPU, alone: a bundle of the seed-0 plain sft model against the direct loop
first_seed=${SEEDS%% *}
if has serve && g export "$WORK/stamp-base-s$first_seed" export "$WORK/bundle" --force; then
  py serve bench/serve.py --bundle "$WORK/bundle" --device "$DEVICE" --requests "$SERVE_REQUESTS" \
    --time-limit "$SERVE_TIME" --rounds 1 --concurrency "$SERVE_CONC" --open-loop "" --max-batch 64 \
    --decode-batch 32 --threads "$THREADS" --out "$RESULTS/json/serve.json"
fi

note "jobs done; $(( DEADLINE - $(date +%s) )) s of the budget left"
"$PYTHON" research/gpu/gpu_tables.py "$RESULTS" --seeds "${SEEDS// /,}" --inits "${INITS// /,}" --model "$MODEL" \
  > "$RESULTS/tables.md" \
  2> "$RESULTS/logs/tables.log"
note "tables: exit $?"
cat "$RESULTS/tables.md"
