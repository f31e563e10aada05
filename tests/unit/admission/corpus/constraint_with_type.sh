#!/bin/bash
#SBATCH --gres=gpu:a100:4
#SBATCH --constraint=ib
#SBATCH -N 2
srun python train.py
