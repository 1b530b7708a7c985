#!/bin/bash
# Train Post-LN and Pre-LN (presets that differ only in norm_placement and the paper's LR schedules) on the same
# data with the same seed, one after the other, then print where the runs are and the commands that fine-tune them.
#
#   launch/compare_placements.sh quick  --data.sources='[{kind: json, path: /data/wiki.jsonl}]'   # minutes (README)
#   launch/compare_placements.sh small  --data.sources='[{kind: json, path: /data/wiki.jsonl}]'   # hours on a CPU
#   launch/compare_placements.sh base                               # BERT-base presets (GPUs; see README)
#   LAUNCH="accelerate launch --config_file configs/accelerate/8gpu.yaml" launch/compare_placements.sh base
#
# Arguments after the scale go to both runs. Before either starts it prints what both will cost, and refuses (exit
# 2) a folder that holds a run with other settings. Ctrl-C (or SIGTERM) checkpoints the running run and exits 130;
# the same command continues both. Variables: LAUNCH (python), OUT (runs/compare-<scale>), SEED (0), COMPARISON
# (compare-<scale>: the W&B tag of python -m finetune.dashboard --comparison, with --tracking.backend=wandb).
set -euo pipefail
cd "$(dirname "$0")/.."

SCALE=${1:?usage: launch/compare_placements.sh quick|small|base [--key=value ...]}
shift
# Each scale's presets, and the seconds a step of them took where measured: STEP_S pretraining (the cost printed
# before the runs start; evaluations and saves included), FT_STEP_S fine-tuning (finetune.schedule's --step_time_s in
# the next commands: its estimate until a job of its own has ended). quick and small (one model and batch):
# 2026-12-06, 2 idle cores of an AMD EPYC (Zen 4, bf16), each run of the quick comparison 300 steps in 135-136 s from
# its run_config.json to its status.json (at a load of 4-8 from other jobs: 236-545 s); its 24 fine-tuning jobs of 32
# steps in 4 min on 2 workers (0.6 s a step, loading and scoring included); a bert_glue.yaml MRPC job of the small
# model 345 steps in 138 s, fp32 on one thread (BENCHMARKS.md section 5: 0.4 s a step).
case "$SCALE" in
  quick) POST="configs/pretrain/small_post_ln.yaml configs/pretrain/quick.yaml"
         PRE="configs/pretrain/small_pre_ln.yaml configs/pretrain/quick.yaml"; STEP_S=0.45 FT_STEP_S=0.6 ;;
  small) POST=configs/pretrain/small_post_ln.yaml; PRE=configs/pretrain/small_pre_ln.yaml; STEP_S=0.45 FT_STEP_S=0.4 ;;
  base)  POST=configs/pretrain/bert_base_post_ln.yaml; PRE=configs/pretrain/bert_base_pre_ln.yaml; STEP_S= FT_STEP_S= ;;
  *) echo "unknown scale '$SCALE'; use quick, small or base" >&2; exit 2 ;;
esac
LAUNCH=${LAUNCH:-python}
OUT=${OUT:-runs/compare-$SCALE}
SEED=${SEED:-0}
# The W&B tag of every run of the comparison (the W&B group is per placement and recipe: seeds pool, placements not).
COMPARISON=${COMPARISON:-compare-$SCALE}
export SCALE POST PRE OUT SEED STEP_S COMPARISON

# A Ctrl-C reaches the run too, which exits 0 ("preempted"): remember it, and read the run's status (a SIGTERM sent
# to the run alone, by a scheduler, reaches only it), or bash would go on to the next placement.
interrupted=0
trap 'interrupted=1' INT TERM
run_status() {  # the status field of RUN/status.json ("" when there is none)
  python -c 'import json, sys; print(json.load(open(sys.argv[1])).get("status", ""))' "$1/status.json" 2>/dev/null || true
}

# Before either run starts, for both: the evaluation cadence (at least 20 evaluations, never fewer than the preset's,
# so that finetune.report interpolates its steps to a loss between close ones; an explicit --train.eval_every comes
# later and wins), the refusal pretrain/run.py would give a folder that holds other settings (in this script's terms:
# its OUT=, and only the options given here, not the cadence it computes), and the cost. Prints "POST_EVERY PRE_EVERY".
plan() {
  python - "$@" <<'PY'
import os, shlex, sys
from pathlib import Path
from pretrain.common.cli import run_cli, to_dict
from pretrain.config import parse_args
from pretrain.run_folder.layout import read_status
from pretrain.run_folder.same_run import check_settings

def plan(user):
    given = {arg[2:].split("=")[0] for arg in user if arg.startswith("--")}
    derived = frozenset() if "train.eval_every" in given else frozenset({"train.eval_every"})
    again = shlex.join(["launch/compare_placements.sh", os.environ["SCALE"], *user])
    new_run = f"start the comparison in another folder: OUT=NEW_DIR {again}"
    everys, left = [], []
    for placement in ("post", "pre"):
        run_dir = Path(os.environ["OUT"]) / placement
        fixed = [arg for preset in os.environ[placement.upper()].split() for arg in ("--config", preset)]
        fixed += [f"--train.seed={os.environ['SEED']}", f"--train.output_dir={run_dir}",
                  f"--train.run_name={os.environ['SCALE']}-{placement}-ln", f"--tracking.comparison={os.environ['COMPARISON']}"]
        train = parse_args([*fixed, *user]).train
        everys.append(max(1, min(train.eval_every or train.max_steps, train.max_steps // 20)))
        cfg = parse_args([*fixed, f"--train.eval_every={everys[-1]}", *user])
        check_settings(run_dir, to_dict(cfg), cfg.train.resume, derived=derived, new_run=new_run)
        left.append(max(0, (train.stop_at_step or train.max_steps) - read_status(run_dir).get("step", 0)))
    step_s = os.environ["STEP_S"]
    cost = (f"about {float(step_s) * sum(left) / 60:.0f} min at {step_s} s a step (this scale's measured figure, in "
            "the script)" if step_s else "no measured time a step for this scale: the runs show theirs")
    print(f"cost: {left[0]:,} + {left[1]:,} steps to train (Post-LN, Pre-LN), {cost}; plus data preparation, once",
          file=sys.stderr)
    print(*everys)

sys.exit(run_cli(lambda: plan(sys.argv[1:]) or 0))
PY
}
everys=$(plan "$@")  # a refusal or a bad option: its message, and exit code 2
read -r POST_EVERY PRE_EVERY <<< "$everys"

for placement in post pre; do
  presets=$POST every=$POST_EVERY
  [[ $placement == pre ]] && presets=$PRE every=$PRE_EVERY
  echo "=== $placement-LN: $presets -> $OUT/$placement"
  configs=()
  for preset in $presets; do configs+=(--config "$preset"); done
  # shellcheck disable=SC2086  # LAUNCH is a command line
  $LAUNCH pretrain/run.py "${configs[@]}" --train.seed="$SEED" --train.eval_every="$every" \
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
grid=configs/finetune/bert_glue.yaml what="3 lrs x 6 seeds, the paper's"
[[ $SCALE == quick ]] && grid=configs/finetune/quick.yaml what="1 lr x 2 seeds, 1,000 examples, 1 epoch"
results=$(sed -n 's/^results_dir: *//p' "$grid")
estimate=${FT_STEP_S:+ --step_time_s=$FT_STEP_S}
from=""
[[ ${OLDPWD:-$PWD} == "$PWD" ]] || from=" (from $PWD)"
cat <<NEXT

next$from: fine-tune every snapshot of both runs on MRPC and RTE ($what;
GLUE in the original TSV layout, or without --data_dir nyu-mll/glue from the Hub), then draw Figure 5 (PNGs and
summary.md):
  python -m finetune.schedule --config=$grid --runs='$runs' --data_dir=path/to/glue --mode=follow --workers=2$estimate
  python -m finetune.report --runs='$runs' --results_dir=$results --out=outputs/figure5
NEXT
