#!/bin/bash
#SBATCH --job=abbrev --nodes=2 --gpus-per-n=h100:1
srun hostname
