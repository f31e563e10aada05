#!/bin/bash
#SBATCH -J from-windows
#SBATCH -N 2
#SBATCH -t 1:00:00

python run.py
