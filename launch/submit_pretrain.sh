#!/bin/bash
# Pretraining as two SLURM jobs: data preparation on a CPU node (launch/slurm_prepare.sbatch), then, once it succeeded
# (--dependency=afterok), the training (launch/slurm_pretrain.sbatch), with the same preset and overrides.
#
#   PRESET=configs/pretrain/bert_base_post_ln.yaml launch/submit_pretrain.sh --train.output_dir=/shared/runs/post_ln
#
# Variables (environment, all optional; the jobs see them too):
#   PRESET               pretraining preset (default configs/pretrain/bert_base_pre_ln.yaml)
#   PREPARE_SBATCH_ARGS  extra sbatch options for the preparation job, e.g. "--partition=cpu --cpus-per-task=32"
#   TRAIN_SBATCH_ARGS    extra sbatch options for the training job, e.g. "--nodes=4 --partition=gpu"
#   GPUS_PER_NODE, MAIN_PORT, ACCELERATE_CONFIG, VENV: as in launch/slurm_pretrain.sbatch
set -euo pipefail
cd "$(dirname "$0")/.."
export PRESET=${PRESET:-configs/pretrain/bert_base_pre_ln.yaml}
read -r -a prepare_args <<< "${PREPARE_SBATCH_ARGS:-}"
read -r -a train_args <<< "${TRAIN_SBATCH_ARGS:-}"
prepare_job=$(sbatch --parsable "${prepare_args[@]}" launch/slurm_prepare.sbatch "$@")
prepare_job=${prepare_job%%;*}  # "jobid;cluster" on a federation
train_job=$(sbatch --parsable --dependency="afterok:$prepare_job" "${train_args[@]}" launch/slurm_pretrain.sbatch "$@")
train_job=${train_job%%;*}
echo "preparation job $prepare_job, then training job $train_job (starts when $prepare_job succeeds)"
