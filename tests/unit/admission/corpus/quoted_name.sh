#!/bin/bash
#SBATCH --job-name="sweep lr=3e-4"
#SBATCH --comment='typed gpus, quoted'
#SBATCH --gres=gpu:h100:1
python run.py
