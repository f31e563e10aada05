#!/bin/bash
#SBATCH --gres=gpu:H100:8
#SBATCH -N 2
srun python train.py
