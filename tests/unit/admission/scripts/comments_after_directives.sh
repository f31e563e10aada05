#!/bin/bash
#SBATCH -N 2  # two nodes
#SBATCH --job-name="my job"   # quoted name with a space
#SBATCH -t 90 #ninety minutes

# a plain comment between directives
#SBATCH --gpus-per-node 2

python run.py
