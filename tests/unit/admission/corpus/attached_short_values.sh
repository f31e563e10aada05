#!/bin/bash
#SBATCH -N2 -n8 -c4 -t1:00:00 -Jpacked
#SBATCH -Gh100:8
srun python train.py
