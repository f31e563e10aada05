#!/bin/bash
#SBATCH -J sweep
#SBATCH -a 0-15:4%2
#SBATCH -o sweep-%A_%a.out
python sweep.py --task $SLURM_ARRAY_TASK_ID
