#!/bin/bash
#SBATCH --gres=gpu:a100:2
#SBATCH -N 1
srun true
