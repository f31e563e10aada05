#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=h100:4 --cpus-per-task=8 --mem=0 -t 4:00:00 -J big
srun python train.py
