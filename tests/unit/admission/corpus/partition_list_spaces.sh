#!/bin/bash
#SBATCH   --partition=gpu,debug     # first gpu, then debug
#SBATCH --gpus=1
python quick.py
