#!/bin/bash
#SBATCH --gpus-per-node=-1
python run.py
