#!/bin/bash
#SBATCH --mem=200G
#SBATCH --cpus-per-task=16
#SBATCH --gres=gpu:h100:1
python preprocess.py
