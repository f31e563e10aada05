#!/bin/sh
#SBATCH --gpus=v100:1
#SBATCH -p debug
nvidia-smi
