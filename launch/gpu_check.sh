#!/usr/bin/env bash
# The GPU check (docs/gpu_check.md): the CUDA tests, the training-step benchmark at BERT-base, a smoke run of the
# three pretraining recipes with an MRPC fine-tune each, and OUT/summary.md with OUT/results.json.
#
#   bash launch/gpu_check.sh OUT --corpus DIR --glue DIR             # on one GPU
#   bash launch/gpu_check.sh OUT --corpus DIR --glue DIR --dry-run   # on CPU, tiny shapes, every step
#
# Exit code 0 when every step passed, 1 otherwise, 2 on bad arguments, 130 when stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" launch/gpu_check.py "$@"
