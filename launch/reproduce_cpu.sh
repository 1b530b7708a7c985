#!/usr/bin/env bash
# CPU-scale reproduction of Xiong et al. 2020, Figure 5 (results in docs/results.md).
#
#   CORPUS=path/to/corpus GLUE=path/to/glue bash launch/reproduce_cpu.sh
#
# CORPUS holds wiki.jsonl and books.jsonl ({"text": ...} per line); GLUE holds MRPC/ and RTE/ (GLUE TSV layout).
# Three runs of the small presets on the same data, seed and tokenizer: Post-LN (1% warm-up, 1e-4), Pre-LN (3e-4)
# and Post-LN at 3e-4 (does it diverge?); the scheduler fine-tunes the first two's snapshots as they appear, then
# the report draws Figure 5. OUT/timing.txt times each phase (on 2 cores: docs/results.md section 4).
#
# Knobs (environment): OUT, STEPS, SNAPSHOTS, SEEDS, LRS, FT_EPOCHS, FT_MAX_TRAIN (empty: all),
# FT_PRECISION (bf16, no, or auto: bf16 where the CPU computes it natively, as the presets' pretraining does),
# FT_WORKERS, GRID_STEPS, SKIP_GRID=1.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${CORPUS:?set CORPUS to a folder with wiki.jsonl and books.jsonl}"
: "${GLUE:?set GLUE to a folder with MRPC/ and RTE/ (GLUE TSV layout)}"
: "${OUT:=runs/repro}" "${STEPS:=3000}" "${SNAPSHOTS:=[600, 1200, 1800, 2400, 3000]}" "${SEEDS:=0 1 2}" "${LRS:=1e-4}"
: "${FT_EPOCHS:=3}" "${FT_MAX_TRAIN:=}" "${FT_PRECISION:=auto}" "${FT_WORKERS:=2}" "${GRID_STEPS:=200}"
export OMP_NUM_THREADS=1  # several single-threaded jobs share the cores; 2 threads each would thrash
mkdir -p "$OUT"
# Ctrl-C reaches every process (the runs checkpoint, the scheduler requeues its jobs): stop here too, not at the
# next phase; the same command continues everything.
stopped() {
  trap '' INT
  echo "=== interrupted: waiting for the runs to save their checkpoints..." >&2
  wait
  echo "=== stopped; run the same command again to continue" >&2
  exit 130
}
trap stopped INT
phase() { echo "$(date -u +%FT%TZ) $SECONDS s  $*" | tee -a "$OUT/timing.txt"; }
# wait_each PID:NAME...: each job's own exit code (`wait A B C` returns only C's); a failure names its log.
failed() { echo "=== $1 failed: see $OUT/$1.log" >&2; }
wait_each() {
  local job status=0
  for job in "$@"; do wait "${job%%:*}" || { failed "${job#*:}"; status=1; }; done
  return "$status"
}

# 34:1 counted in documents (2734 articles : 81 books) uses 94% of them, with a validation set of both kinds (the
# presets count words, where 34:1 takes 2 books). Every run, the grid's too.
data=(
  --data.sources="[{kind: json, path: $CORPUS/wiki.jsonl, weight: 34}, {kind: json, path: $CORPUS/books.jsonl, weight: 1}]"
  --data.weight_by=documents --data.validation_fraction=0.02 --data.cache_dir="$OUT/cache"
)
common=("${data[@]}" --train.max_steps="$STEPS" --train.snapshot_steps="$SNAPSHOTS" --train.snapshot_at_start=false
        --train.checkpoint_every=1000 --train.eval_every=100 --train.eval_batches=20 --train.seed=0)
pretrain() {  # name preset [overrides...]
  local name=$1 preset=$2; shift 2
  python pretrain/run.py --config "configs/pretrain/$preset.yaml" "${common[@]}" \
    --train.output_dir="$OUT/$name" --train.run_name="$name" "$@" > "$OUT/$name.log" 2>&1
}
if [[ $FT_PRECISION == auto ]]; then
  # Without AVX512-BF16 or AMX, bf16 is emulated: no fine-tuning job had finished after 32 minutes (95 s with it).
  FT_PRECISION=$(python -c 'from pretrain.common.hardware import cpu_has_native_bf16; print("no" if cpu_has_native_bf16() is False else "bf16")')
  echo "fine-tuning precision: $FT_PRECISION (FT_PRECISION=auto: bf16 only where this CPU computes it natively)"
fi
recipe=(--recipe.epochs="$FT_EPOCHS" --recipe.mixed_precision="$FT_PRECISION")
[[ -n $FT_MAX_TRAIN ]] && recipe+=(--recipe.max_train_examples="$FT_MAX_TRAIN")
lrs="[${LRS// /, }]" seeds="[${SEEDS// /, }]"  # the knobs are space-separated; the options take YAML lists

# 1. The tokenizer (WordPiece, 8192, trained on the corpus) and the instances, built once and shared.
phase "1. tokenizer and instances"
pretrain warm_cache small_post_ln --train.max_steps=1 --train.snapshot_steps='[]' --train.snapshot_at_end=false ||
  { failed warm_cache; exit 1; }
tokenizer="$OUT/warm_cache/tokenizer"

# 2. The three runs side by side (same data, masks, seed and tokenizer); the first two fine-tuned as they go.
phase "2. pretraining (3 runs) and scheduled fine-tuning"
runs=()
pretrain post_ln small_post_ln --data.tokenizer="$tokenizer" & runs+=("$!:post_ln")
pretrain pre_ln small_pre_ln --data.tokenizer="$tokenizer" & runs+=("$!:pre_ln")
pretrain post_ln_lr3e-4 small_post_ln --data.tokenizer="$tokenizer" --optim.lr=3e-4 & runs+=("$!:post_ln_lr3e-4")
python -m finetune.schedule --runs="[$OUT/post_ln, $OUT/pre_ln]" --data_dir="$GLUE" --tasks='[mrpc, rte]' \
  --lrs="$lrs" --seeds="$seeds" --results_dir="$OUT/finetune.d" --mode=follow --workers="$FT_WORKERS" \
  --total_threads="$FT_WORKERS" "${recipe[@]}" > "$OUT/finetune.log" 2>&1 &
scheduler=$!
if ! wait_each "${runs[@]}"; then
  kill -INT "$scheduler" 2>/dev/null || true  # it stops its workers and queues their jobs again
  wait "$scheduler" || true
  exit 1
fi
phase "   pretraining done"
wait_each "$scheduler:finetune" || exit 1
phase "   fine-tuning done"

# 3. Figure 5.
python -m finetune.report --runs="[$OUT/post_ln, $OUT/pre_ln, $OUT/post_ln_lr3e-4]" --results_dir="$OUT/finetune.d" \
  --tasks='[mrpc, rte]' --out="$OUT/report" > "$OUT/report.log" 2>&1
phase "3. report written: $OUT/report/summary.md"

# 4. The baseline without pretraining (same architecture, tokenizer and recipe, random weights), one task per core,
#    each with a results folder of its own: a results folder has one writer at a time.
last=$(printf "%s/pre_ln/snapshots/step_%08d" "$OUT" "$STEPS")
baseline=()
for task in mrpc rte; do
  python -m finetune.run --model="$last" --task="$task" --data_dir="$GLUE" --lrs="$lrs" --seeds="$seeds" \
    --results_dir="$OUT/finetune_random_init_$task.d" --recipe.torch_threads=1 --recipe.progress=false "${recipe[@]}" \
    --recipe.random_init=true > "$OUT/finetune_random_init_$task.log" 2>&1 &
  baseline+=("$!:finetune_random_init_$task")
done
wait_each "${baseline[@]}" || exit 1
phase "4. random-init baseline done"

# 5. Warm-up x peak-lr grid at depth 12 (does Post-LN need warm-up?), same data; two cells at a time.
[[ ${SKIP_GRID:-0} == 1 ]] && exit 0
overrides=$(printf '"%s", ' "${data[@]#--}" "data.tokenizer=$tokenizer")  # a YAML list of key=value
overrides="[${overrides}train.eval_batches=20]"
python -m pretrain.analysis grid --preset=configs/pretrain/small_post_ln.yaml --placements='[post, pre]' --jobs=2 \
  --warmup_steps='[0, 50]' --lrs='[3e-4, 1e-3, 3e-3]' --max_steps="$GRID_STEPS" --depths='[12]' --hidden_sizes='[128]' \
  --num_heads=4 --seeds='[0]' --boundary_seeds=1 --probe_steps=0 --overrides="$overrides" --out="$OUT/grid" > "$OUT/grid.log" 2>&1
phase "5. grid done: $OUT/grid/table.txt"
