#!/bin/bash
#SBATCH --gres=gpu:b200:8
srun true
