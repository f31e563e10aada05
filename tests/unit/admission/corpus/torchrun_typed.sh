#!/bin/bash
#MUSTER --torchrun
#SBATCH -N 2 --gpus-per-node=h100:8
train.py
