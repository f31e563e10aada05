#!/bin/bash
#SBATCH --frobnicate=yes
#SBATCH -N 1
python run.py
