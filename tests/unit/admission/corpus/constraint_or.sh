#!/bin/bash
#SBATCH -C 'rack1|rack2'
#SBATCH -N 6 --gpus-per-node=8
srun python train.py
