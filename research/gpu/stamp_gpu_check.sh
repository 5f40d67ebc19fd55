#!/usr/bin/env bash
# The device check that #5 still needs: Recall@5 of STAMP with gencli's default SAP layer (--stamp-layer 0: a quarter
# of the layers, 8 of smollm2's 30) on smollm2-135m, two seeds each: on sample_data, base and stamp (one seed of
# each was measured on the CPU: L = 8 came within noise of base, L = 2 lost half); on MovieLens-100k (not measured
# at a sane lr), base, map, sap and stamp. Sized for one call on one H200 (~8 min: 2 x init-vocab 20 s, then
# 3 waves of 4 runs side by side, ~90-120 s each).
#
#   GENCLI_HOME=/path/with/smollm2 bash research/gpu/stamp_gpu_check.sh SAMPLE_WORKDIR ML100K_WORKDIR OUT_DIR
#
# Each workdir must hold ingest, embed and quantize (e.g. bench/common.py prepare_shared(..., 3, 64));
# init-vocab (smollm2-135m, centroid) is run here when missing. Settings are those of the H200 and CPU tables in
# docs/benchmarks.md (300 steps, batch 32, lr 2e-4, 400 validation users, 20 beams, seeds 0 and 1).
set -uo pipefail
SAMPLE=${1:?sample workdir}; ML100K=${2:?ml100k workdir}; OUT=${3:?output folder}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# overridable for a dry run on a CPU: DEVICE=cpu STEPS=2 USERS=10 (with tiny init-vocab workdirs)
DEVICE=${DEVICE:-cuda}; STEPS=${STEPS:-300}; USERS=${USERS:-400}
for w in "$SAMPLE" "$ML100K"; do
  [ -d "$w/init-vocab" ] || python -m gencli init-vocab --model smollm2-135m --init centroid --workdir "$w" --json \
    | tail -c 200 || exit 2
done
# MovieLens-100k has 96,458 sft samples of 136 tokens on average (max history 40): 300 steps are 0.1 epoch,
# where smollm2 stayed below the popularity baseline (Recall@5 0.024 on all 1,886 valid + test users, from
# bench/paired_recall.py; 0.052 on test if seen items are excluded, which gencli eval does not), so ML_STEPS (default STEPS) should be
# raised when the device budget allows: one epoch is 3,015 steps (13.1M tokens), estimated at ~7 min per run from
# the 30k tokens/s base measured alone on an H200 (not timed), i.e. ~30 min for base and stamp at two seeds.
ML_STEPS=${ML_STEPS:-$STEPS}
common="--seeds 2 --jobs 4 --batch-size 32 --lr 2e-4 --max-history 40 --eval-users $USERS --eval-beams 20 --device $DEVICE"
python bench/stamp.py recall --workdir "$SAMPLE" $common --max-steps "$STEPS" --eval-every $(( (STEPS + 1) / 2 )) \
  --variants base,stamp --out "$OUT/sample/recall.json" 2>&1 | grep -v -i warn | tail -8
python bench/stamp.py recall --workdir "$ML100K" $common --max-steps "$ML_STEPS" --eval-every $(( (ML_STEPS + 1) / 2 )) \
  --variants base,map,sap,stamp --out "$OUT/ml100k/recall.json" 2>&1 | grep -v -i warn | tail -10
