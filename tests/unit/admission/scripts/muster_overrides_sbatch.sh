#!/bin/bash
#MUSTER -N 4
#SBATCH -N 2
#SBATCH --gpus-per-node=4
#MUSTER --torchrun
torchrun run.py
