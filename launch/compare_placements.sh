#!/bin/bash
# Train Post-LN and Pre-LN (presets that differ only in norm_placement and the paper's LR schedules) on the same
# data with the same seed, one after the other, then print where the runs are.
#
#   launch/compare_placements.sh small  --data.sources='[{kind: json, path: /data/wiki.jsonl}]'
#   launch/compare_placements.sh base                               # BERT-base presets (GPUs; see README)
#   LAUNCH="accelerate launch --config_file configs/accelerate/8gpu.yaml" launch/compare_placements.sh base
#
# Arguments after the scale go to both runs. Ctrl-C (or SIGTERM) checkpoints the running run and exits 130; the same
# command continues both. Variables: LAUNCH (python), OUT (runs/compare-<scale>), SEED (0), COMPARISON
# (compare-<scale>: the W&B tag of python -m finetune.dashboard --comparison, with --tracking.backend=wandb).
set -euo pipefail
cd "$(dirname "$0")/.."

SCALE=${1:?usage: launch/compare_placements.sh small|base [--key=value ...]}
shift
case "$SCALE" in
  small) POST=configs/pretrain/small_post_ln.yaml; PRE=configs/pretrain/small_pre_ln.yaml ;;
  base)  POST=configs/pretrain/bert_base_post_ln.yaml; PRE=configs/pretrain/bert_base_pre_ln.yaml ;;
  *) echo "unknown scale '$SCALE'; use small or base" >&2; exit 2 ;;
esac
LAUNCH=${LAUNCH:-python}
OUT=${OUT:-runs/compare-$SCALE}
SEED=${SEED:-0}
# The W&B tag of every run of the comparison (the W&B group is per placement and recipe: seeds pool, placements not).
COMPARISON=${COMPARISON:-compare-$SCALE}

# A Ctrl-C reaches the run too, which exits 0 ("preempted"): remember it, and read the run's status (a SIGTERM sent
# to the run alone, by a scheduler, reaches only it), or bash would go on to the next placement.
interrupted=0
trap 'interrupted=1' INT TERM
run_status() {  # the status field of RUN/status.json ("" when there is none)
  python -c 'import json, sys; print(json.load(open(sys.argv[1])).get("status", ""))' "$1/status.json" 2>/dev/null || true
}

# At least 20 evaluations (never fewer than the preset's), so that finetune.report interpolates its steps to a loss
# between close ones; an explicit --train.eval_every comes later and wins. Empty when the options do not parse.
eval_every() {  # the cadence for preset $1 and the arguments after it
  python -c 'import sys
from pretrain.config import parse_args
train = parse_args(sys.argv[1:]).train
print(max(1, min(train.eval_every or train.max_steps, train.max_steps // 20)))' --config "$@" 2>/dev/null || true
}

for placement in post pre; do
  preset=$POST; [[ $placement == pre ]] && preset=$PRE
  echo "=== $placement-LN: $preset -> $OUT/$placement"
  every=$(eval_every "$preset" "$@")
  # shellcheck disable=SC2086  # LAUNCH is a command line
  $LAUNCH pretrain/run.py --config "$preset" --train.seed="$SEED" ${every:+--train.eval_every="$every"} \
    --train.output_dir="$OUT/$placement" --train.run_name="$SCALE-$placement-ln" \
    --tracking.comparison="$COMPARISON" "$@"
  if (( interrupted )) || [[ $(run_status "$OUT/$placement") == preempted ]]; then
    echo "=== stopped: $placement-LN saved a checkpoint in $OUT/$placement; run the same command again to continue" \
      "the comparison (both runs)" >&2
    exit 130
  fi
done

# Plain json: importing the project (pretrain.run_folder.layout, torch) would cost seconds for a summary.
python - "$OUT" <<'PY'
import contextlib, json, sys
out = sys.argv[1]
for placement in ("post", "pre"):
    run = f"{out}/{placement}"
    rows = []
    for line in open(f"{run}/metrics.jsonl"):
        with contextlib.suppress(json.JSONDecodeError):  # the line a killed run was writing
            rows.append(json.loads(line))
    curve = "  ".join(f"{r['step']}:{r['val/mlm_loss']:.3f}" for r in rows if "val/mlm_loss" in r)
    status = json.load(open(f"{run}/status.json"))["status"]
    print(f"{placement:>4}-LN  status={status}  val/mlm_loss  {curve}")
PY

# What comes next (README.md, "The next step"), run from this checkout like the script (OUT may be relative).
runs="[$OUT/post, $OUT/pre]"
from=""
[[ ${OLDPWD:-$PWD} == "$PWD" ]] || from=" (from $PWD)"
cat <<NEXT

next$from: fine-tune every snapshot of both runs on MRPC and RTE (3 lrs x 6 seeds; GLUE in the original TSV
layout, or without --data_dir nyu-mll/glue from the Hub), then draw Figure 5 (PNGs and summary.md):
  python -m finetune.schedule --config=configs/finetune/bert_glue.yaml --runs='$runs' --data_dir=path/to/glue --mode=follow --workers=2
  python -m finetune.report --runs='$runs' --out=outputs/figure5
NEXT
