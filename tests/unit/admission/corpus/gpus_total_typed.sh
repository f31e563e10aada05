#!/bin/bash
#SBATCH -G h100:16
srun python train.py
