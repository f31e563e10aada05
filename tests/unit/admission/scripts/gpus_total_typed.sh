#!/bin/bash
#SBATCH --gpus=a100:16
srun python train.py
