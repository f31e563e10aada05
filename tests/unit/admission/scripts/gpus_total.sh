#!/bin/bash
#SBATCH -N 2
#SBATCH -G 16
srun python train.py
