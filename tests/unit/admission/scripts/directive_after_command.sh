#!/bin/bash
#SBATCH -N 1
module load cuda
#SBATCH -N 3
python run.py
