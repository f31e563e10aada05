#!/bin/bash
#SBATCH -p debug
#SBATCH --gpus-per-node=h100:1
srun true
