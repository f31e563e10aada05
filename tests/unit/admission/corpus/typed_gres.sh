#!/bin/bash
#SBATCH --job-name=llm-sft
#SBATCH --gres=gpu:h100:4
#SBATCH --time=12:00:00
srun python sft.py
