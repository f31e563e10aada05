#!/bin/bash
#SBATCH --ntasks=4
#SBATCH --gpus-per-task=a100:1
srun python worker.py
