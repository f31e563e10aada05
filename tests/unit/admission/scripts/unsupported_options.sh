#!/bin/bash
#SBATCH --mail-type=END,FAIL
#SBATCH --mail-user=alice@example.org
#SBATCH --licenses=matlab:1
#SBATCH --reservation=maint
#SBATCH -N 1
python run.py
