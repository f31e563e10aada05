#!/bin/bash
#SBATCH -N 2
#SBATCH --exclusive
#SBATCH -C nvlink
srun python train.py
