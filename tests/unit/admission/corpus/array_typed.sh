#!/bin/bash
#SBATCH --array=0-9%2
#SBATCH --gres=gpu:a100:1
#SBATCH -o logs/%A_%a.out
python sweep.py --index $SLURM_ARRAY_TASK_ID
