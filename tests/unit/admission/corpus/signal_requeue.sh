#!/bin/bash
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --gres=gpu:h100:8
srun python train.py
