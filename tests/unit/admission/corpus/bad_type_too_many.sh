#!/bin/bash
#SBATCH -N 5
#SBATCH --gpus-per-node=a100:4
srun true
