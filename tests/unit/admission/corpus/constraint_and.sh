#!/bin/bash
#SBATCH -N 4
#SBATCH --gpus-per-node=4
#SBATCH --constraint="ib&nvlink"
srun python train.py
