#!/bin/bash
#SBATCH --gpus-per-node=A100:4
srun true
