#!/usr/bin/env bash
# Elastic fine-tune: shrinks to 2 nodes if a GPU dies.
#SBATCH -J finetune
#SBATCH -N 2:4
#SBATCH --gres=gpu:a100:4
#MUSTER --torchrun

torchrun train.py
