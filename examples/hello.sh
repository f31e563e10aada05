#!/bin/bash
#SBATCH --job-name=hello
#SBATCH --nodes=2
#SBATCH --gpus-per-node=1
#SBATCH --time=00:05:00
#SBATCH --output=hello-%j-%N.out
#
# A batch script as sbatch users write it: Muster reads the #SBATCH lines at submit
# time and runs the script once on every node of the job. It prints what a job sees.
set -eu

echo "hello from $(hostname) as $(id -un)"
echo "job ${SLURM_JOB_ID:-?} '${SLURM_JOB_NAME:-?}' node ${SLURM_NODEID:-?} of ${SLURM_NNODES:-?} (${SLURM_JOB_NODELIST:-?})"
echo "rank ${RANK:-?} of ${WORLD_SIZE:-?}, master ${MASTER_ADDR:-?}:${MASTER_PORT:-?}"
echo "gpus on node: ${SLURM_GPUS_ON_NODE:-0} (CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES-}')"
echo "restart count: ${MUSTER_RESTART_COUNT:-0}, workdir: $(pwd)"
env | grep -E '^(MUSTER|SLURM|SLURMD)_|^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|GROUP_RANK|NNODES|MASTER_ADDR|MASTER_PORT|CUDA_VISIBLE_DEVICES)=' | sort
