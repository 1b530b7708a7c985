#!/usr/bin/env bash
# The GPU check (docs/gpu_check.md; what it runs and its exit codes: launch/gpu_check.py, or --help):
#
#   bash launch/gpu_check.sh OUT --corpus DIR --glue DIR [--dry-run]   # --dry-run: on CPU, tiny shapes, every step
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" launch/gpu_check.py "$@"
