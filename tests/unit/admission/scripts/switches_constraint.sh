#!/bin/bash
#SBATCH -N 2 --gpus-per-node=8
#SBATCH --switches=1@10:00
#SBATCH -C "a100&ib"
srun python allreduce_bench.py
