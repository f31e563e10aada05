#!/bin/bash
#SBATCH --constraint=[rack1|rack2]
#SBATCH --nodes=4
#SBATCH --exclusive
srun python train.py
