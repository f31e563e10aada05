#!/bin/bash
#SBATCH -t 1-12
#SBATCH --gres=gpu:h100:4
srun true
