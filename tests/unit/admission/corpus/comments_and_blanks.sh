#!/bin/bash
# Fine-tune on one node.

#SBATCH --job-name=ft   # a short name
#SBATCH --gres=gpu:h100:2

## #SBATCH --nodes=8    (disabled)
#SBATCH --time=2:00:00
module load cuda
srun python ft.py
#SBATCH --nodes=4
