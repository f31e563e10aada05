#!/bin/bash
#SBATCH --constraint=[rack1|rack2]
#SBATCH -N 5
srun true
