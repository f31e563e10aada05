#!/bin/bash
#SBATCH --no-requeue
#SBATCH --signal=10@60
python run.py
