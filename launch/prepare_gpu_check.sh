#!/usr/bin/env bash
# Prepare what the GPU check needs on a machine without network (run here, where PyPI is reachable):
#
#   CORPUS=path/to/corpus GLUE=path/to/glue bash launch/prepare_gpu_check.sh
#
# into the git-ignored folder .gpu_payload/ (carry it with the device call):
#   wheels/   the packages the GPU machine lacks, for Python 3.12 manylinux x86-64, at the versions tested here
#             (its image has torch, transformers, accelerate, tokenizers, pandas, pyarrow, scikit-learn,
#             matplotlib, pytest; it lacks datasets and its dill and multiprocess). More with
#             EXTRA_WHEELS="pyarrow==24.0.0 ..." (then the corpus copy shrinks to fit).
#   corpus/   a gzip JSON Lines copy of CORPUS's *.jsonl (text only), subsampled if it would not fit
#   glue/     GLUE/MRPC/{train,dev}.tsv
# and checks that the working tree plus the payload stay within the 64 MiB that travel per call (exit 2 if not).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CORPUS:?set CORPUS to a JSON Lines corpus (a file or a folder of *.jsonl)}"
: "${GLUE:?set GLUE to a folder in the GLUE layout (MRPC/train.tsv, MRPC/dev.tsv)}"
PAYLOAD=${PAYLOAD:-.gpu_payload}
PYTHON=${PYTHON:-python3}

# Pin each to the version installed here, which the CPU tests ran with.
version() { "$PYTHON" -c "from importlib.metadata import version; print(version('$1'))"; }
wheels=()
for name in datasets dill multiprocess; do wheels+=("$name==$(version "$name")"); done
# shellcheck disable=SC2206
wheels+=(${EXTRA_WHEELS:-})

rm -rf "$PAYLOAD/wheels"
mkdir -p "$PAYLOAD/wheels"
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$PAYLOAD/wheels" "${wheels[@]}"
ls -l "$PAYLOAD/wheels"
"$PYTHON" launch/gpu_check_payload.py --corpus "$CORPUS" --glue "$GLUE" --payload "$PAYLOAD"
echo "ready: run the check on a GPU with
  bash launch/gpu_check.sh \$OUT/gpu --corpus $PAYLOAD/corpus --glue $PAYLOAD/glue
(device tool: carry [\"$PAYLOAD\"])"
