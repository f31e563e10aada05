#!/bin/bash
#SBATCH -C ib&rack1*2
#SBATCH -N 3
srun hostname
