#!/bin/bash
#SBATCH -C ib&rack1*5
#SBATCH -N 6
srun true
