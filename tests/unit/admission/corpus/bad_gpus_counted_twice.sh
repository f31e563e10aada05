#!/bin/bash
#SBATCH --ntasks=2 --gpus-per-task=h100:2
#SBATCH --gpus-per-node=4
srun true
