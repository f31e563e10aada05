#!/bin/bash
#SBATCH -p debug
#SBATCH --gres=gpu:volta:2
python smoke.py
