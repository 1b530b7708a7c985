#!/usr/bin/env bash
# The GPU check in one command (environment, CUDA tests, throughput against Hugging Face, a BERT-base smoke test
# of the scale path, the torch.compile row): 6 minutes on one H200 plus at most 2 for the compile. See
# launch/gpu_check.py for the stages.
#
#   bash launch/prepare_gpu_check.sh          # here, with PyPI: wheels, corpus and GLUE into .gpu_payload/
#   bash launch/gpu_check.sh OUT --corpus .gpu_payload/corpus --glue .gpu_payload/glue
#   bash launch/gpu_check.sh OUT --corpus C --glue G --dry-run      # CPU, tiny shapes, every stage
#
# Writes OUT/results.json, OUT/summary.md, OUT/loss_curves.png and OUT/check.log; runs and caches go to --work
# (default: a new folder under /tmp). Exit code 0 when every stage passed (the compile stage may also time out),
# 1 otherwise, 2 on bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline
exec "${PYTHON:-python3}" launch/gpu_check.py "$@"
