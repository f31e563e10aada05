#!/bin/bash
#SBATCH --nodes=2
#SBATCH --gpus-per-node=a100:2
#SBATCH --ntasks-per-node=2
srun python ddp.py
