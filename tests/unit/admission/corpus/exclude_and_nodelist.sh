#!/bin/bash
#SBATCH -w h[01-02]
#SBATCH -x h08
#SBATCH -N 2 --gres=gpu:h100:8
srun python train.py
