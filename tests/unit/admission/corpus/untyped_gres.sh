#!/bin/bash
#SBATCH --gres=gpu:2
python eval.py
