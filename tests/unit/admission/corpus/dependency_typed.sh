#!/bin/bash
#SBATCH --dependency=afterok:41
#SBATCH --gres=gpu:a100:1
python eval.py
