#!/bin/bash
#SBATCH -N 1-3 --gpus-per-node=4 -t 4:00:00
python sweep.py
