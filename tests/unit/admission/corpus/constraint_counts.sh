#!/bin/bash
#SBATCH --constraint="[rack1*2&rack2*2]"
#SBATCH -N 4
srun hostname
