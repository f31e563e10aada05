#!/bin/bash
#SBATCH -H
#SBATCH --nice=50
#SBATCH --comment="nightly eval"
#SBATCH --export=ALL,WANDB_MODE=offline
python eval.py
